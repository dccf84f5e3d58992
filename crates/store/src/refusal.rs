//! What the store refuses to do because of the state it finds: each refusal is a usage
//! error (exit code 2) built where the state is read, saying why and what to do instead.
//! It is carried as [`crate::StoreError::Refused`]; what only the config or the command
//! line can tell (a projection the config lacks) is refused by the engine instead.

use walfold_config::{quote_ident, QualifiedName};
use walfold_event::DeadLetterStatus;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The config names, for a projection, the subscriber a rebuild replays under.
    #[error(
        "the config names {configured} for {projection}, but a rebuild is replaying under \
         that ID; keep {active} until the rebuild has switched over"
    )]
    SubscriberRebuilding {
        projection: String,
        configured: String,
        active: String,
    },
    /// The config names a new subscriber for a projection whose storage holds what the
    /// active one built: every event would be applied to it again.
    #[error(
        "the config names subscriber {configured} for {projection}, but {} holds \
         what {active} built: under a new ID every event would be applied to it \
         again. To move {projection} to a new ID, rebuild it (walfold rebuild \
         {projection} --subscriber {configured}); to keep it, set subscriber = \
         \"{active}\"; {}",
        built_in(table.as_ref()),
        replay_fix(table.as_ref(), registry, projection)
    )]
    SubscriberBuiltOver {
        projection: String,
        configured: String,
        active: String,
        /// The projection's table, if it names one.
        table: Option<QualifiedName>,
        /// walfold's schema, quoted, whose `projection` table is the registry.
        registry: String,
    },
    /// A projection's definition differs from the one its subscriber folded with, and
    /// its `on_definition_change` is `refuse`.
    #[error(
        "projection {projection}: its definition changed since subscriber {subscriber} folded \
         with it, and walfold never folds a new definition onto the rows an old one built. \
         What differs (- recorded, + config):\n{diff}\nTo go on: set on_definition_change = \
         \"rebuild\" on it (a blue/green rebuild under a new subscriber starts by itself; the \
         old definition serves until the switch-over), or on_definition_change = \"accept\" \
         if the change is compatible with the rows built so far, or undo the change"
    )]
    DefinitionChanged {
        projection: String,
        subscriber: String,
        diff: String,
    },
    /// A changed definition would start a rebuild, but one with another definition is
    /// replaying.
    #[error(
        "projection {projection}: its definition changed again while rebuild {subscriber} \
         replays another one; abort that rebuild (walfold rebuild {projection} --abort) and \
         start again, or restore the definition it rebuilds"
    )]
    DefinitionRebuildOpen {
        projection: String,
        subscriber: String,
    },
    /// Ending a rebuild is the leader's work; this handle is bound to no fence.
    #[error(
        "only the leader ends the rebuild of {projection}; the leading daemon carries out the \
         recorded abort"
    )]
    NotLeader { projection: String },
    /// A rebuild's sibling table name would not fit in PostgreSQL's 63 bytes.
    #[error("table name {name} would be longer than PostgreSQL's 63 bytes; rename {live} first")]
    NameTooLong { name: String, live: QualifiedName },
    #[error("the live table {live} does not exist")]
    NoLiveTable { live: QualifiedName },
    /// A table by the name a rebuild needs (its shadow or retired table) exists.
    #[error(
        "table {table} exists already; walfold needs that name for the rebuild: drop or rename it"
    )]
    NameTaken { table: QualifiedName },
    /// walfold's role does not own the live table, which the switch-over renames.
    #[error(
        "walfold's role {role} does not own {live}, and the switch-over renames it: \
         run alter table {} owner to {} as its owner (or grant the owner's role to \
         {role}); `walfold doctor` lists what a rebuild needs",
        live.quoted(),
        quote_ident(role)
    )]
    NotOwner { role: String, live: QualifiedName },
    /// Views, foreign keys or triggers that a rename would leave on the retired table;
    /// `found` lists them.
    #[error(
        "{live} has {found}: a rebuild swaps tables by renaming, which would leave them on the \
         retired table; drop them and recreate them after the switch-over"
    )]
    Dependents { live: QualifiedName, found: String },
    /// The projection has a rebuild that is not finished.
    #[error(
        "projection {projection} already has a rebuild ({subscriber}, state {state}); {}",
        open_next(projection, *switched)
    )]
    RebuildOpen {
        projection: String,
        subscriber: String,
        state: String,
        /// Whether it has switched over (and only waits for `--finish`).
        switched: bool,
    },
    /// A rebuild's subscriber ID has been used on this target.
    #[error(
        "subscriber ID {subscriber} has been used before; a rebuild needs a new one \
         (its claims must start empty), e.g. {subscriber}.2"
    )]
    SubscriberUsed { subscriber: String },
    /// The projection's statement fails on the shadow table; `error` is the server's.
    #[error(
        "the projection's statement does not run on the rebuild's table {shadow}: {error}{}",
        shadow_hint(shadow, live, *undefined_table)
    )]
    StatementOnShadow {
        shadow: QualifiedName,
        live: QualifiedName,
        error: String,
        /// The server found no table by a name it was given: most likely the live
        /// table's, written instead of `{table}`.
        undefined_table: bool,
    },
    /// The projection has no rebuild that `action` (abort, finish) applies to;
    /// `state` is that of the rebuild it has, if any.
    #[error("{}", no_rebuild_to(projection, action, state.as_ref()))]
    NoRebuildTo {
        projection: String,
        action: &'static str,
        state: Option<OpenState>,
    },
    #[error("no dead letter with id {id}")]
    NoDeadLetter { id: i64 },
    /// A dead letter of a row that never became an event cannot be retried.
    #[error(
        "dead letter {id} was rejected at ingest and never became an event: \
         fix the producer and write a new outbox row, then discard this one"
    )]
    RejectedAtIngest { id: i64 },
    #[error("dead letter {id} is {status}, not open")]
    LetterNotOpen { id: i64, status: DeadLetterStatus },
}

/// The state of a projection's open rebuild, as a refusal names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpenState {
    /// Switched over: only its retired table is left to drop.
    Switched,
    /// Still replaying or catching up (the state's name).
    Replaying(String),
}

fn built_in(table: Option<&QualifiedName>) -> String {
    match table {
        Some(t) => format!("its table {t}"),
        None => "what it writes".to_owned(),
    }
}

fn replay_fix(table: Option<&QualifiedName>, registry: &str, projection: &str) -> String {
    match table {
        Some(t) => format!("to replay all of history into {t} deliberately, empty it first"),
        None => format!(
            "to replay all of history deliberately, undo what it wrote and delete its \
             registry row (delete from {registry}.projection where name = '{projection}')"
        ),
    }
}

fn open_next(projection: &str, switched: bool) -> String {
    match switched {
        true => {
            format!("run `walfold rebuild {projection} --finish` to drop its retired table first")
        }
        false => format!(
            "wait for it to switch and run `walfold rebuild {projection} --finish`, or `--abort` it"
        ),
    }
}

fn shadow_hint(shadow: &QualifiedName, live: &QualifiedName, undefined_table: bool) -> String {
    match undefined_table {
        true => format!(
            ". A rebuild writes to {shadow}, so the sql must name its table only as \
             {{table}}: give it an alias (`insert into {{table}} as t ... set total = \
             t.total + 1`) instead of writing {live}'s name"
        ),
        false => String::new(),
    }
}

fn no_rebuild_to(projection: &str, action: &str, state: Option<&OpenState>) -> String {
    match state {
        Some(OpenState::Switched) => format!(
            "the rebuild of {projection} has switched over already; nothing to {action} \
             (run `walfold rebuild {projection} --finish` to drop the retired table)"
        ),
        Some(OpenState::Replaying(state)) => format!(
            "the rebuild of {projection} is still {state}; it switches over once it has caught up"
        ),
        None => format!("projection {projection} has no rebuild to {action}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusals that are worked out from their fields read as they did when each
    /// was a message written where it was made.
    #[test]
    fn a_refusal_says_what_its_message_said() {
        let (projection, configured, active) = ("totals", "totals.v2", "totals.v1");
        let t = QualifiedName::parse("public.totals").unwrap();
        let built = |table: Option<QualifiedName>| Refusal::SubscriberBuiltOver {
            projection: projection.into(),
            configured: configured.into(),
            active: active.into(),
            table,
            registry: "\"walfold\"".into(),
        };
        for (what, fix, table) in [
            (
                format!("its table {t}"),
                format!("to replay all of history into {t} deliberately, empty it first"),
                Some(t.clone()),
            ),
            (
                "what it writes".to_owned(),
                format!(
                    "to replay all of history deliberately, undo what it wrote and delete its \
                     registry row (delete from {}.projection where name = '{projection}')",
                    "\"walfold\""
                ),
                None,
            ),
        ] {
            assert_eq!(
                built(table).to_string(),
                format!(
                    "the config names subscriber {configured} for {projection}, but {what} holds \
                     what {active} built: under a new ID every event would be applied to it \
                     again. To move {projection} to a new ID, rebuild it (walfold rebuild \
                     {projection} --subscriber {configured}); to keep it, set subscriber = \
                     \"{active}\"; {fix}"
                )
            );
        }
        for switched in [true, false] {
            let next = if switched {
                format!(
                    "run `walfold rebuild {projection} --finish` to drop its retired table first"
                )
            } else {
                format!("wait for it to switch and run `walfold rebuild {projection} --finish`, or `--abort` it")
            };
            let e = Refusal::RebuildOpen {
                projection: projection.into(),
                subscriber: configured.into(),
                state: "replaying".into(),
                switched,
            };
            assert_eq!(
                e.to_string(),
                format!(
                    "projection {projection} already has a rebuild ({}, state {}); {next}",
                    configured, "replaying"
                )
            );
        }
        let shadow = QualifiedName::parse("public.totals__rebuild").unwrap();
        let live = t.clone();
        let hint = format!(
            ". A rebuild writes to {shadow}, so the sql must name its table only as \
             {{table}}: give it an alias (`insert into {{table}} as t ... set total = \
             t.total + 1`) instead of writing {live}'s name"
        );
        let e = Refusal::StatementOnShadow {
            shadow: shadow.clone(),
            live: live.clone(),
            error: "ERROR (42P01): relation does not exist".into(),
            undefined_table: true,
        };
        assert_eq!(
            e.to_string(),
            format!(
                "the projection's statement does not run on the rebuild's table {shadow}: {}{hint}",
                "ERROR (42P01): relation does not exist"
            )
        );
        let action = "abort";
        for (state, text) in [
            (
                Some(OpenState::Switched),
                format!(
                    "the rebuild of {projection} has switched over already; nothing to {action} \
                     (run `walfold rebuild {projection} --finish` to drop the retired table)"
                ),
            ),
            (
                Some(OpenState::Replaying("replaying".into())),
                format!(
                    "the rebuild of {projection} is still {}; it switches over once it has caught up",
                    "replaying"
                ),
            ),
            (None, format!("projection {projection} has no rebuild to {action}")),
        ] {
            let e = Refusal::NoRebuildTo {
                projection: projection.into(),
                action,
                state,
            };
            assert_eq!(e.to_string(), text);
        }
        let role = "walfold";
        assert_eq!(
            Refusal::NotOwner {
                role: role.into(),
                live: live.clone()
            }
            .to_string(),
            format!(
                "walfold's role {role} does not own {live}, and the switch-over renames it: \
                 run alter table {} owner to {} as its owner (or grant the owner's role to \
                 {role}); `walfold doctor` lists what a rebuild needs",
                live.quoted(),
                quote_ident(role)
            )
        );
    }
}
