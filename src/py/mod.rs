//! The Python bindings (`ferrofeed._core`): thin wrappers over the core,
//! conversions and the error mapping. The only module that touches Python.

// Lengths and offsets of mappings and Python sequences always fit in isize
// (Py_ssize_t): no allocation or mapping exceeds isize::MAX bytes, and an
// index that passed `normalize` is non-negative.
#![allow(clippy::cast_possible_wrap, clippy::cast_sign_loss)]

mod arena;
mod convert;
mod cpu;
mod dlpack;
mod errors;
mod hang;
mod image;
mod index;
mod mix;
mod ops;
mod pack;
mod pipeline;
mod plan;
mod remote;
mod sampler;
mod samples;
mod shards;
mod slots;
mod spec;
mod staging;

use pyo3::prelude::*;

/// The compiled core of ferrofeed. Use the public names in `ferrofeed`.
#[pymodule]
#[pyo3(name = "_core")]
fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add(
        "build_profile",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    )?;
    arena::register(m)?;
    cpu::register(m)?;
    pipeline::register(m)?;
    ops::register(m)?;
    sampler::register(m)?;
    plan::register(m)?;
    mix::register(m)?;
    shards::register(m)?;
    pack::register(m)?;
    index::register(m)?;
    remote::register(m)?;
    dlpack::register(m)?;
    staging::register(m)?;
    slots::register(m)?;
    image::register(m)?;
    spec::register(m)?;
    m.add("cuda_feature", cfg!(feature = "cuda"))?;
    Ok(())
}
