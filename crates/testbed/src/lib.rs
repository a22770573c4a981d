//! Where macrolink's tests and benchmarks run, and the pieces they share:
//! network namespaces joined by veth links shaped with `tc tbf`
//! ([`netns`]), child processes that say where they listen on a ready line
//! ([`ready`], [`peer`]), repeatable test data ([`data`]), and the rule for
//! tests that need root or namespaces ([`require`]), a cluster file for
//! one host per process ([`site`]), what a run made, undone also when
//! a signal stops it ([`undo`]), and how much of a file is cached
//! ([`pages`]).
//!
//! ```text
//!   test / bench ──spawn──► macrolink ROLE (echo, gateway, sink, serve, ...)
//!        │                        │ stdout: region ep=.. key=..   (0..n)
//!        │ ◄── Peer::spawn_cmd ───┘         ready node=.. tcp=..  (1)
//!        │
//!        ├── Testbed::build(shape) ──► namespaces C / G / S, veth, bridges, tbf
//!        └── data::pattern(n, seed) ─► the bytes sent, to compare with
//! ```
//!
//! The product prints its ready lines through [`ready::Line`] too, so the
//! printer and the parser are one piece of code.

pub mod data;
pub mod netns;
pub mod pages;
pub mod peer;
pub mod ready;
pub mod refusing;
pub mod require;
pub mod site;
pub mod undo;

pub use peer::Peer;
