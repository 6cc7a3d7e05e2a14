//! The sources of a Python pipeline: a Python iterator, or a native range.

use pyo3::prelude::*;
use pyo3::types::PyIterator;

use super::Item;
use crate::pipeline::Source;
use crate::py::hang;

/// A Python iterator pulled on the source thread, several items per GIL
/// acquisition.
pub(super) struct PySource {
    pub(super) iter: Py<PyIterator>,
    /// Turn paths and bytes into native items (the first stage is native).
    pub(super) native: bool,
    /// The position in the source of the next item pulled.
    pub(super) next_pos: u64,
}

impl PySource {
    fn convert(&mut self, v: Bound<'_, PyAny>) -> Item {
        let pos = self.next_pos;
        self.next_pos += 1;
        if self.native {
            Item::from_source(v, Some(pos))
        } else {
            Item::Py(v.unbind())
        }
    }
}

impl Source<Item, PyErr> for PySource {
    fn next_batch(&mut self, max: usize, out: &mut Vec<Item>) -> PyResult<bool> {
        self.next_batch_offering(max, out, &mut Some)
    }

    /// Pulls up to `max` items in one GIL acquisition, offering each as it
    /// comes: an iterator that is slow to yield (a stream, a queue) has each
    /// item go on as soon as it is pulled, not when a batch is full.
    fn next_batch_offering(
        &mut self,
        max: usize,
        out: &mut Vec<Item>,
        offer: &mut dyn FnMut(Item) -> Option<Item>,
    ) -> PyResult<bool> {
        Python::attach(|py| {
            let it = self.iter.bind(py).clone();
            for _ in 0..max {
                let Some(v) = hang::next(&it) else {
                    return Ok(false);
                };
                let item = self.convert(v?);
                if out.is_empty() {
                    // Refused (the queue is full): the engine sends it, and
                    // what follows, when the GIL is let go.
                    out.extend(offer(item));
                } else {
                    out.push(item);
                }
            }
            Ok(true)
        })
    }
}

/// A native range of integers: no GIL at all.
pub(super) struct RangeSource {
    pub(super) next: i64,
    pub(super) stop: i64,
    pub(super) step: i64,
}

impl Source<Item, PyErr> for RangeSource {
    fn next_batch(&mut self, max: usize, out: &mut Vec<Item>) -> PyResult<bool> {
        for _ in 0..max {
            let more = if self.step > 0 {
                self.next < self.stop
            } else {
                self.next > self.stop
            };
            if !more {
                return Ok(false);
            }
            out.push(Item::Int(self.next));
            self.next = match self.next.checked_add(self.step) {
                Some(n) => n,
                None => self.stop,
            };
        }
        Ok(true)
    }
}
