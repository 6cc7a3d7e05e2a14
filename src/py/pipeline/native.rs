//! `ferrofeed._core.NativeOp`: a stage of Rust code, run without the GIL.

use std::sync::Arc;

use pyo3::prelude::*;

use super::Item;
use crate::pipeline::{AsyncItemFn, CombineFn, ItemFn};

/// What `ops.decode_image` and `ops.collate` were made with: the
/// `DataLoader`'s batch op (`py/ops.rs`) is built from them. It lives here,
/// with the ops that carry it, so that this module never names `ops`.
#[derive(Clone, Copy)]
pub(crate) enum OpConfig {
    /// `decode_image`: the image spec, and the seed the user gave (if any).
    Decode {
        spec: crate::image::spec::ImageSpec,
        seed: Option<u64>,
    },
    /// `collate`: the layout and dtype of the batch, and the `max_batches` and
    /// `timeout` of its own buffer pool when either is not the default (a
    /// pipeline's collate takes its batches from that pool; a `DataLoader` has
    /// a pool of its own, so it refuses them).
    Collate {
        layout: crate::image::batch::Layout,
        own_pool: Option<(usize, Option<f64>)>,
    },
}

/// Makes a native op's function for a pipeline's epoch (see
/// [`PyNativeOp::per_epoch`]).
pub(crate) type PerEpochFn = Arc<dyn Fn(u64) -> ItemFn<Item, PyErr> + Send + Sync>;

/// A native stage: Rust code run on items without the GIL.
#[pyclass(name = "NativeOp", module = "ferrofeed._core", frozen)]
pub(crate) struct PyNativeOp {
    pub(super) name: String,
    /// Run on the blocking pool (CPU-heavy) rather than inline.
    pub(super) blocking: bool,
    pub(super) f: ItemFn<Item, PyErr>,
    /// For an op whose function depends on the pipeline's epoch (random
    /// draws): makes the function a pipeline of that epoch runs; `f` is the
    /// one of epoch 0.
    per_epoch: Option<PerEpochFn>,
    /// For a grouping op (`collate`): the group size, `drop_last`, and how
    /// a group becomes one item.
    pub(super) group: Option<(usize, bool, CombineFn<Item, PyErr>)>,
    /// What the op was made with, when another op is built from it
    /// (`DataLoader`'s batch op takes `decode_image`'s and `collate`'s).
    config: Option<OpConfig>,
    /// For an op that hands its work to threads of its own and finishes
    /// there (`DataLoader`'s batch op on the loader's CPU pool): a function
    /// that starts an item and returns its result's future, awaited by the
    /// stage without holding any thread; `f` is then not used.
    pub(super) spawned: Option<AsyncItemFn<Item, PyErr>>,
}

#[pymethods]
impl PyNativeOp {
    /// The op's name (the default stage name).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// For a grouping op (`ops.collate`), the number of items per group (0
    /// when none was given: a `DataLoader` then uses its batch size).
    #[getter]
    fn group_size(&self) -> Option<usize> {
        self.group.as_ref().map(|g| g.0)
    }

    /// For a grouping op, whether a last, short group is dropped.
    #[getter]
    fn drop_last(&self) -> Option<bool> {
        self.group.as_ref().map(|g| g.1)
    }

    /// `ops.decode_image`'s image spec (`None` for other ops).
    #[getter]
    fn spec(&self) -> Option<crate::py::spec::PyImageSpec> {
        match self.config {
            Some(OpConfig::Decode { spec, .. }) => Some(crate::py::spec::PyImageSpec(spec)),
            _ => None,
        }
    }

    /// `ops.decode_image`'s `seed=` (`None` when none was given, and for
    /// other ops).
    #[getter]
    fn seed(&self) -> Option<u64> {
        match self.config {
            Some(OpConfig::Decode { seed, .. }) => seed,
            _ => None,
        }
    }

    /// `ops.collate`'s batch layout (`None` for other ops).
    #[getter]
    fn layout(&self) -> Option<crate::py::spec::PyBatchLayout> {
        match self.config {
            Some(OpConfig::Collate { layout, .. }) => Some(crate::py::spec::PyBatchLayout(layout)),
            _ => None,
        }
    }

    fn __repr__(&self) -> String {
        format!("<ferrofeed native op {}>", self.name)
    }
}

impl PyNativeOp {
    pub(crate) fn new(name: &str, blocking: bool, f: ItemFn<Item, PyErr>) -> Self {
        Self {
            name: name.to_owned(),
            blocking,
            f,
            per_epoch: None,
            group: None,
            config: None,
            spawned: None,
        }
    }

    /// An op that starts each item on threads of its own and returns the
    /// future of its result (see [`PyNativeOp::spawned`]'s field): a
    /// pipeline awaits it in the stage's task, so no thread waits for it.
    pub(crate) fn spawning(name: &str, start: AsyncItemFn<Item, PyErr>) -> Self {
        Self {
            spawned: Some(start),
            ..Self::new(
                name,
                false,
                Arc::new(|_| {
                    Err(pyo3::exceptions::PyTypeError::new_err(
                        "this native op starts its items on threads of its own: it runs in a pipeline's stage",
                    ))
                }),
            )
        }
    }

    /// An op whose function depends on the pipeline's epoch: `make(epoch)`
    /// gives the function a pipeline built for that epoch runs
    /// (`PipelineBuilder.build(epoch=...)`).
    pub(crate) fn per_epoch(name: &str, blocking: bool, make: PerEpochFn) -> Self {
        let f = make(0);
        Self {
            per_epoch: Some(make),
            ..Self::new(name, blocking, f)
        }
    }

    /// The function a pipeline of `epoch` runs for this op.
    pub(super) fn item_fn(&self, epoch: u64) -> ItemFn<Item, PyErr> {
        match &self.per_epoch {
            Some(make) => make(epoch),
            None => Arc::clone(&self.f),
        }
    }

    /// The op, remembering what it was made with.
    pub(crate) fn with_config(mut self, config: OpConfig) -> Self {
        self.config = Some(config);
        self
    }

    /// What the op was made with (see [`PyNativeOp::with_config`]).
    pub(crate) fn config(&self) -> Option<OpConfig> {
        self.config
    }

    /// For a grouping op, its group size (0: none given) and `drop_last`.
    pub(crate) fn grouping(&self) -> Option<(usize, bool)> {
        self.group.as_ref().map(|g| (g.0, g.1))
    }

    /// A grouping op: `size` items (fewer at the end unless `drop_last`)
    /// become one through `combine`.
    pub(crate) fn aggregate(
        name: &str,
        size: usize,
        drop_last: bool,
        combine: CombineFn<Item, PyErr>,
    ) -> Self {
        Self {
            name: name.to_owned(),
            blocking: false,
            f: Arc::new(|_| {
                Err(pyo3::exceptions::PyTypeError::new_err(
                    "a grouping op is used with PipelineBuilder.pipe(), which makes it an aggregate stage",
                ))
            }),
            per_epoch: None,
            group: Some((size, drop_last, combine)),
            config: None,
            spawned: None,
        }
    }
}

/// `ops.identity()`: passes items through unchanged (natively).
#[pyfunction]
pub(super) fn _op_identity() -> PyNativeOp {
    PyNativeOp::new("identity", false, Arc::new(|item| Ok(Some(item))))
}
