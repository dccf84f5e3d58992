//! The end-to-end suites, one module each, in one test binary: one crate to compile and
//! one executable to link instead of thirteen. nextest still runs every test in its own
//! process, so each test gets its own `Cluster::shared()` and a fresh database on it,
//! as before.

mod cluster;
mod daemon;
mod definitions;
mod descriptors;
mod doctor;
mod failover;
mod frameworks;
mod library;
mod mapping;
mod memory;
mod observability;
mod operator_tools;
mod operators;
mod outbox_shapes;
mod partition;
mod pipeline;
mod poison;
mod pooler;
mod read_your_writes;
mod rebuild;
mod resources;
mod secrets;
mod security;
mod soak;
mod sources;
mod streaming;
mod strict;
mod targets;
mod tls;
