//! `_core._Lanes`: a `DataLoader`'s share of the CPU pools ([`Lanes`]),
//! handed to its batch op, and read by `loader.stats()["pools"]`.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::runtime::cpu::Lanes;

/// The threads a loader's batch decodes run on, and their busy and idle
/// time over the loader's current (or last) pass.
#[pyclass(name = "_Lanes", module = "ferrofeed._core", frozen)]
pub(crate) struct PyLanes {
    pub(crate) lanes: Arc<Lanes>,
}

#[pymethods]
impl PyLanes {
    #[new]
    fn new(threads: usize) -> Self {
        Self {
            lanes: Arc::new(Lanes::new(threads)),
        }
    }

    /// The threads of the pool.
    #[getter]
    fn threads(&self) -> usize {
        self.lanes.threads()
    }

    /// Starts a pass: the figures count from now.
    fn start_pass(&self) {
        self.lanes.start_span();
    }

    /// Ends the pass: the figures stop growing.
    fn end_pass(&self) {
        self.lanes.end_span();
    }

    /// The pass's figures: `threads`, `wall_s`, `busy_s`, `idle_s`, `busy`
    /// (the busy share of `threads x wall_s`), `batches`, `in_flight` (now)
    /// and `max_in_flight` (the most batches decoding at once so far).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.lanes.report();
        let d = PyDict::new(py);
        d.set_item("threads", r.threads)?;
        d.set_item("wall_s", r.wall.as_secs_f64())?;
        d.set_item("busy_s", r.busy.as_secs_f64())?;
        d.set_item("idle_s", r.idle.as_secs_f64())?;
        d.set_item("busy", r.busy_share())?;
        d.set_item("batches", r.calls)?;
        d.set_item("in_flight", r.in_flight)?;
        d.set_item("max_in_flight", r.max_in_flight)?;
        Ok(d)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLanes>()
}
