//! # ferrofeed
//!
//! A framework-agnostic, Rust-accelerated data loader for ML training.
//!
//! This crate is the pure-Rust core. It never names a Python type: the pyo3
//! bindings live in the `py` module, compiled only with the `python` feature
//! (which maturin turns on when it builds the wheel), so `cargo test` and
//! `cargo bench` run without an interpreter.
//!
//! ## Modules
//!
//! Top down: each uses only modules listed before it (`DESIGN.md` has the
//! map).
//!
//! - [`seed`]: the one stable, pinned seed mixer behind every shuffle, crop
//!   and per-sample seed.
//! - `panic` and [`fs`]: a caught panic's message; files opened without
//!   blocking, and whether a temporary file's writer is gone.
//! - [`runtime`]: what a process keeps for native work, one of each, made
//!   again in a forked child: the tokio runtime that pipelines and remote
//!   fetches share, and the CPU pools ([`runtime::cpu`]).
//! - [`sampler`]: seekable shuffled index orders, O(1) to start or resume.
//! - [`plan`]: the plans of an epoch behind one trait, [`plan::Plan`]:
//!   numbered batches of sample ids per rank, from any resume point, for
//!   every executor; map-style ([`plan::EpochPlan`]) and sharded
//!   ([`plan::ShardPlan`], across ranks and elastic resumes).
//! - [`recycle`]: a process-wide pool of byte buffers for the shard readers.
//! - [`remote`]: shards in object storage (S3, GCS, Azure, HTTP), fetched
//!   ahead within a byte budget and cached on local disk.
//! - [`shards`]: the readers of sharded sources (tar, Parquet, JSON lines),
//!   local or fetched by [`remote`].
//! - [`arena`]: the shared arena, one memory-mapped file of opaque items that
//!   every process on a node maps, so dataset metadata exists once per node.
//! - [`dlpack`]: the `DLPack` structs, the `__dlpack__` request rules, and
//!   managed tensors whose deleter drops a Rust owner.
//! - [`staging`]: a bounded pool of 64-byte aligned (and, with a CUDA
//!   driver, pinned) host buffers, and [`staging::Tensor`], a pooled buffer
//!   exported by `DLPack`.
//! - [`image`]: decode, resize, crop and flip into a slot of a batch, and the
//!   batch engine ([`image::batch`]), which decodes into [`staging`] buffers.
//! - [`pipeline`]: the engine: a source, stages on the process's runtime
//!   linked by bounded channels, stats, clean failure and shutdown.
//!
//! The Python bindings (`py`) are built on all of these.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod arena;
pub mod dlpack;
pub mod fs;
pub mod image;
mod panic;
pub mod pipeline;
pub mod plan;
pub mod recycle;
pub mod remote;
pub mod runtime;
pub mod sampler;
pub mod seed;
pub mod shards;
pub mod staging;

#[cfg(feature = "python")]
mod py;

#[cfg(test)]
mod fuzz_inputs;
