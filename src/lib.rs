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
//! - [`pipeline`]: the engine: a source, stages on a tokio runtime linked by
//!   bounded channels, stats, clean failure and shutdown.
//! - [`arena`]: the shared arena, one memory-mapped file of opaque items that
//!   every process on a node maps, so dataset metadata exists once per node.
//!
//! The pipeline engine, image kernels, staging buffers and `DLPack` export are
//! built on top of these (see `DESIGN.md`).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod arena;
pub mod pipeline;

#[cfg(feature = "python")]
mod py;
