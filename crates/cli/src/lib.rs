//! The `macrolink` command and the pieces its tests reuse.

pub mod bench;
pub mod cluster;
pub mod compare;
pub mod demo;
pub mod echo;
pub mod filebench;
pub mod files;
pub mod gwbench;
pub mod iobench;
pub mod node_args;
pub mod peer;
pub mod roles;
pub mod testbed;
pub mod up;
