//! The key column's type: char(n), varchar(n), citext, nondeterministic collations,
//! domains, name.

use walfold_tempdb::Cluster;

use crate::twin::{evs, twin, STATUS};

/// Was a bug on 0e9042d: a `char(n)` key. The round statement compares returned keys with
/// `walfold_k::character`, `format_type(bpchar, null)` = `character` = char(1), so
/// `'o-1'` becomes `'o'` and no event of a key longer than one character is ever seen as
/// changed: rounds say Stale where the loop says Changed (rows are the same).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn char_n_key() {
    let mut t = twin(
        "strchar",
        "create table {t} (order_id char(8) primary key, status text, version bigint not null)",
        "order_id",
        STATUS,
    )
    .await;
    assert!(!t.fast.applies_in_rounds(), "install keeps the loop");
    let why = Cluster::shared()
        .psql(
            &t.db,
            "select format_type('bpchar'::regtype, null), 'o-1'::text::character",
        )
        .unwrap();
    eprintln!("  format_type and the cast: {}", why.trim());
    t.same(&[
        evs(
            1,
            &[
                ("o-1", 1, "a"),
                ("o-2", 1, "b"),
                ("o-1", 2, "c"),
                ("o-1", 1, "d"),
            ],
        ),
        evs(10, &[("o-2", 5, "e")]),
    ])
    .await;
}

/// Was a bug on 0e9042d: a `char(n)` key where ids differ only by trailing spaces (equal as bpchar): one
/// round holds both, and the set-based upsert fails with 21000 ("cannot affect row a
/// second time") where the loop applies them one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn char_n_key_trailing_spaces() {
    let mut t = twin(
        "strcharsp",
        "create table {t} (order_id char(4) primary key, status text, version bigint not null)",
        "order_id",
        STATUS,
    )
    .await;
    t.same(&[evs(1, &[("x", 1, "a"), ("x ", 2, "b")])]).await;
}

/// Was a bug on 0e9042d: `varchar(3)` silently drops trailing spaces beyond its length on assignment, so
/// `abc ` is the row `abc`; the returned key `abc` does not equal `'abc '::varchar`, so
/// an event that updated the row is reported Stale (and in one batch with `abc`, the round
/// fails with 21000 where the loop succeeds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn varchar_n_key_trailing_spaces() {
    let mut t = twin(
        "strvarchar",
        "create table {t} (order_id varchar(3) primary key, status text, version bigint not null)",
        "order_id",
        STATUS,
    )
    .await;
    assert!(!t.fast.applies_in_rounds(), "install keeps the loop");
    t.same(&[evs(1, &[("abc", 1, "a")]), evs(2, &[("abc ", 2, "b")])])
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn varchar_n_key_trailing_spaces_one_batch() {
    let mut t = twin(
        "strvarchar1",
        "create table {t} (order_id varchar(3) primary key, status text, version bigint not null)",
        "order_id",
        STATUS,
    )
    .await;
    t.same(&[evs(1, &[("abc", 1, "a"), ("abc ", 2, "b")])])
        .await;
}

/// A too-long id into `varchar(3)` fails both ways (22001).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn varchar_n_key_too_long() {
    let mut t = twin(
        "strvarlong",
        "create table {t} (order_id varchar(3) primary key, status text, version bigint not null)",
        "order_id",
        STATUS,
    )
    .await;
    let (f, s) = t.both(&evs(1, &[("abc", 1, "a"), ("abcd", 1, "b")])).await;
    assert_eq!(f, s);
    assert!(s.is_err());
    t.same(&[evs(5, &[("ab", 1, "a"), ("abc", 1, "b"), ("ab", 2, "c")])])
        .await;
}

/// Was a bug on 0e9042d: a citext key: `A` and `a` are one row. In one round (they are different strings to
/// the batch splitter) the upsert fails with 21000 where the loop succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn citext_key_mixed_case_one_batch() {
    let mut t = twin(
        "strcitext",
        "create extension if not exists citext;
         create table {t} (order_id citext primary key, status text, version bigint not null)",
        "order_id",
        STATUS,
    )
    .await;
    assert!(!t.fast.applies_in_rounds(), "install keeps the loop");
    t.same(&[evs(1, &[("A", 1, "a"), ("a", 2, "b")])]).await;
}

/// Was a bug on 0e9042d: a citext key with a stored row `a` v5: a round with `a` v3 (stale, leaves the row
/// alone, so no 21000) and `A` v7 (updates it) reports both Changed, since the one
/// returned key `a` matches both ids case-insensitively. The loop: Stale, Changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn citext_key_stale_and_changed_in_one_round() {
    let mut t = twin(
        "strcitext2",
        "create extension if not exists citext;
         create table {t} (order_id citext primary key, status text, version bigint not null)",
        "order_id",
        STATUS,
    )
    .await;
    t.sql("insert into {t} values ('a', 'kept', 5)");
    t.same(&[evs(1, &[("a", 3, "old"), ("A", 7, "new")])]).await;
}

/// citext across batches (one id per round): same as the loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn citext_key_across_batches() {
    let mut t = twin(
        "strcitext3",
        "create extension if not exists citext;
         create table {t} (order_id citext primary key, status text, version bigint not null)",
        "order_id",
        STATUS,
    )
    .await;
    t.same(&[
        evs(1, &[("Ab", 1, "a"), ("x", 1, "b")]),
        evs(3, &[("aB", 2, "c"), ("X", 3, "e")]),
        evs(5, &[("AB", 1, "d"), ("x", 3, "f")]),
        evs(7, &[("ab", 4, "g")]),
    ])
    .await;
}

/// Was a bug on 0e9042d: a text key under a nondeterministic (case-insensitive) ICU collation: rounds are
/// chosen, and with a stored row `a` v5 the round [a v3, A v7] reports Changed, Changed
/// (the loop: Stale, Changed), as with citext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nondeterministic_collation_key() {
    let mut t = twin(
        "strcoll",
        "do $$ begin
           if not exists (select 1 from pg_collation where collname = 'walfold_ci') then
             create collation walfold_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
           end if; end $$;
         create table {t} (order_id text collate walfold_ci primary key, status text, version bigint not null)",
        "order_id",
        STATUS,
    )
    .await;
    t.sql("insert into {t} values ('a', 'kept', 5)");
    t.same(&[
        evs(1, &[("a", 3, "old"), ("A", 7, "new")]),
        evs(3, &[("B", 1, "b"), ("b", 2, "c")]),
    ])
    .await;
}

/// A domain over text with a check: ids that pass are the loop's, one that fails fails
/// both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn domain_key_with_check() {
    let mut t = twin(
        "strdomain",
        "do $$ begin
           if not exists (select 1 from pg_type where typname = 'okey') then
             create domain okey as text check (value like 'o-%');
           end if; end $$;
         create table {t} (order_id okey primary key, status text, version bigint not null)",
        "order_id",
        STATUS,
    )
    .await;
    eprintln!("rounds: {}", t.fast.applies_in_rounds());
    t.same(&[
        evs(1, &[("o-1", 1, "a"), ("o-2", 1, "b"), ("o-1", 2, "c")]),
        evs(4, &[("o-3", 1, "a"), ("bad", 1, "b")]),
        evs(6, &[("O-1", 1, "a")]),
    ])
    .await;
}

/// Was a bug on 0e9042d: a `name` key: ids differing only past 63 bytes are one row; in one round the
/// upsert fails with 21000 where the loop gives Changed, Changed, Changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn name_key_truncation() {
    let mut t = twin(
        "strname",
        "create table {t} (order_id name primary key, status text, version bigint not null)",
        "order_id",
        STATUS,
    )
    .await;
    let long = "x".repeat(63);
    let a = format!("{long}a");
    let b = format!("{long}b");
    t.same(&[evs(1, &[("o-1", 1, "a"), (&a, 1, "x"), (&b, 2, "y")])])
        .await;
}
