// `sqlx::migrate!` embeds `migrations/` at build time: rebuild when a migration is added.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
