//! Property-style robustness test: randomly mutated fixture bytes must never make `decode` or `parse_text` panic.

mod common;

use common::{decode_all, load, FIXTURES};
use walfold_pgoutput::{decode, oid, parse_text, Column, Message};

const ITERATIONS: usize = 100_000;

/// xorshift64*: tiny deterministic PRNG, good enough to drive mutations.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n).expect("fits");
        usize::try_from(self.next() % n).expect("fits")
    }

    fn byte(&mut self) -> u8 {
        self.next().to_le_bytes()[0]
    }
}

/// Bytes that are interesting at length, count and marker positions.
const SPECIAL: [u8; 16] = [
    0x00, 0x01, 0x7f, 0x80, 0xff, b'N', b'K', b'O', b'n', b'u', b't', b'b', b'S', b'E', b'A', b'c',
];

fn mutate(rng: &mut XorShift, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut buf = input.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let len = buf.len();
        match rng.below(9) {
            // Flip one bit.
            0 if len > 0 => {
                let i = rng.below(len);
                if let Some(b) = buf.get_mut(i) {
                    *b ^= 1 << rng.below(8);
                }
            }
            // Overwrite a byte with a random or special value.
            1 if len > 0 => {
                let i = rng.below(len);
                let v = if rng.below(2) == 0 {
                    rng.byte()
                } else {
                    SPECIAL[rng.below(SPECIAL.len())]
                };
                if let Some(b) = buf.get_mut(i) {
                    *b = v;
                }
            }
            // Truncate at a random length.
            2 => buf.truncate(rng.below(len + 1)),
            // Extend with random bytes.
            3 => {
                let extra = rng.below(32);
                buf.extend((0..extra).map(|_| rng.byte()));
            }
            // Insert random bytes in the middle.
            4 => {
                let at = rng.below(len + 1);
                let extra: Vec<u8> = (0..1 + rng.below(8)).map(|_| rng.byte()).collect();
                buf.splice(at..at, extra);
            }
            // Remove a range.
            5 if len > 0 => {
                let start = rng.below(len);
                let end = start + rng.below(len - start + 1);
                buf.drain(start..end);
            }
            // Overwrite 2 or 4 bytes with an extreme big-endian integer.
            6 if len >= 4 => {
                let at = rng.below(len - 3);
                let value: [u8; 4] = match rng.below(5) {
                    0 => [0xff; 4],
                    1 => [0x7f, 0xff, 0xff, 0xff],
                    2 => [0x80, 0, 0, 0],
                    3 => [0, 0, 0, 0],
                    _ => [0, 0, 0xff, 0xff],
                };
                let width = if rng.below(2) == 0 { 2 } else { 4 };
                for (slot, v) in buf.iter_mut().skip(at).zip(value.iter().skip(4 - width)) {
                    *slot = *v;
                }
            }
            // Splice the tail of another message onto a prefix of this one.
            7 => {
                let keep = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                buf.truncate(keep);
                buf.extend_from_slice(other.get(from..).unwrap_or_default());
            }
            // Entirely random buffer of a random length.
            _ => {
                let n = rng.below(48);
                buf = (0..n).map(|_| rng.byte()).collect();
            }
        }
    }
    buf
}

const OIDS: [u32; 14] = [
    oid::BOOL,
    oid::INT8,
    oid::INT2,
    oid::INT4,
    oid::TEXT,
    oid::JSON,
    oid::VARCHAR,
    oid::BPCHAR,
    oid::TIMESTAMPTZ,
    oid::NUMERIC,
    oid::UUID,
    oid::JSONB,
    oid::NAME,
    16385,
];

fn exercise_values(message: &Message<'_>, rng: &mut XorShift) {
    let tuples = match message {
        Message::Insert(i) => vec![&i.new],
        Message::Update(u) => u.old.iter().chain(std::iter::once(&u.new)).collect(),
        Message::Delete(d) => vec![&d.old],
        _ => return,
    };
    for tuple in tuples {
        for column in &tuple.columns {
            if let Column::Text(raw) | Column::Binary(raw) = column {
                let type_oid = OIDS[rng.below(OIDS.len())];
                let _ = parse_text(type_oid, raw);
            }
        }
    }
}

#[test]
fn mutated_fixtures_never_panic() {
    // Pick a fixture file first, so the ~1500 streamed inserts do not dominate.
    let corpus: Vec<Vec<Vec<u8>>> = FIXTURES.iter().map(|name| load(name)).collect();
    for file in &corpus {
        // The unmutated inputs all decode (decode_all panics otherwise).
        assert_eq!(decode_all(file).len(), file.len());
    }
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    let pick = |rng: &mut XorShift| {
        let file = corpus.get(rng.below(corpus.len())).expect("in range");
        file.get(rng.below(file.len())).expect("in range")
    };
    let mut decoded_ok = 0usize;
    for _ in 0..ITERATIONS {
        let input = pick(&mut rng);
        let other = pick(&mut rng);
        let mutated = mutate(&mut rng, input, other);
        for in_stream in [false, true] {
            if let Ok(message) = decode(&mutated, in_stream) {
                decoded_ok += 1;
                exercise_values(&message, &mut rng);
            }
        }
    }
    // Sanity: the mutations are not all fatal, so the success paths are exercised too.
    assert!(decoded_ok > ITERATIONS / 20, "only {decoded_ok} decoded");
}

/// Text values from the fixtures plus PostgreSQL-format samples, mutated and parsed as every type.
#[test]
fn mutated_text_values_never_panic() {
    let mut seeds: Vec<Vec<u8>> = [
        "2026-11-30 02:25:48.123456+00",
        "1850-01-01 12:00:00.5+05:53:28",
        "294276-12-31 23:59:59.999999+00",
        "0001-01-01 00:00:00+00 BC",
        "infinity",
        "-Infinity",
        "12345.6789",
        "-9223372036854775808",
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "t",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let corpus: Vec<Vec<u8>> = FIXTURES
        .iter()
        .take(3)
        .flat_map(|name| load(name))
        .collect();
    for buf in &corpus {
        if let Ok(Message::Insert(i)) = decode(buf, false) {
            for column in &i.new.columns {
                if let Column::Text(raw) = column {
                    seeds.push(raw.to_vec());
                }
            }
        }
    }
    let mut rng = XorShift(0xD1B5_4A32_D192_ED03);
    for _ in 0..ITERATIONS {
        let seed = seeds.get(rng.below(seeds.len())).expect("in range");
        let other = seeds.get(rng.below(seeds.len())).expect("in range");
        let mutated = mutate(&mut rng, seed, other);
        for type_oid in OIDS {
            let _ = parse_text(type_oid, &mutated);
        }
    }
}
