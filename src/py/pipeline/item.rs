//! The [`Item`] that travels through a pipeline, and its conversions.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// An item travelling through a pipeline.
pub(crate) enum Item {
    /// A Python object.
    Py(Py<PyAny>),
    /// A native integer (from a native range source).
    Int(i64),
    /// A native group (from `aggregate` over native items).
    List(Vec<Item>),
    /// A file path, with an optional label (from a source of paths).
    Path {
        path: std::path::PathBuf,
        label: Option<i64>,
        /// The item's position in the pipeline's source (0, 1, ...), for
        /// the random draws of native ops (`ops.decode_image`); `None` for
        /// a path inside a group.
        pos: Option<u64>,
    },
    /// Encoded bytes (a file's content), named for errors.
    Bytes {
        data: Vec<u8>,
        name: String,
        label: Option<i64>,
        /// As for `Path`: the position in the source, if known.
        pos: Option<u64>,
    },
    /// Encoded bytes left in a file (a tar member of a local shard), read
    /// by the thread that decodes them; named for errors.
    Located {
        at: crate::fs::FileRange,
        name: String,
        label: Option<i64>,
    },
    /// A decoded image.
    Image {
        image: crate::image::DecodedImage,
        name: String,
        label: Option<i64>,
    },
    /// A collated batch of images, and their labels.
    Batch {
        images: crate::staging::Tensor,
        labels: Option<crate::staging::Tensor>,
    },
    /// A group of an epoch plan, for `DataLoader`'s batch op: its number in
    /// the epoch, the dataset indices of its items, and the items (paths or
    /// bytes, with labels), made native on the source's thread.
    Group {
        batch_no: u64,
        indices: Vec<u64>,
        items: Vec<Item>,
    },
    /// A batch made by `DataLoader`'s batch op: its number in the epoch and
    /// the dataset indices of its items, the images that decoded (none when
    /// every one failed), their labels, and the items left out under
    /// `on_error="skip"` as (dataset index, reason).
    Loaded {
        batch_no: u64,
        indices: Vec<u64>,
        images: Option<crate::staging::Tensor>,
        labels: Option<crate::staging::Tensor>,
        skipped: Vec<(u64, String)>,
    },
}

impl Item {
    /// What kind of item this is, for error messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Item::Py(_) => "a Python object",
            Item::Int(_) => "an int",
            Item::List(_) => "a list",
            Item::Path { .. } => "a path",
            Item::Bytes { .. } | Item::Located { .. } => "bytes",
            Item::Image { .. } => "a decoded image",
            Item::Batch { .. } | Item::Loaded { .. } => "a batch",
            Item::Group { .. } => "a group of the epoch plan",
        }
    }

    /// A native item for a Python source object when there is one: a path
    /// (`str` or `os.PathLike`), encoded `bytes`, or either paired with an
    /// int label; else the object itself. `pos` is its position in the
    /// source (the items of a list have none).
    pub(crate) fn from_source(obj: Bound<'_, PyAny>, pos: Option<u64>) -> Item {
        if let Ok(group) = obj.cast::<PyPlanGroup>() {
            if let Some(item) = group.get().take() {
                return item;
            }
        }
        let plain = |obj: &Bound<'_, PyAny>, label: Option<i64>| -> Option<Item> {
            if let Ok(b) = obj.cast::<pyo3::types::PyBytes>() {
                return Some(Item::Bytes {
                    data: b.as_bytes().to_vec(),
                    name: "<bytes>".into(),
                    label,
                    pos,
                });
            }
            let is_path = obj.is_instance_of::<pyo3::types::PyString>()
                || obj
                    .hasattr(pyo3::intern!(obj.py(), "__fspath__"))
                    .unwrap_or(false);
            if !is_path {
                return None;
            }
            let path: std::path::PathBuf = obj.extract().ok()?;
            Some(Item::Path { path, label, pos })
        };
        if let Ok(t) = obj.cast::<PyTuple>() {
            if t.len() == 2 {
                if let (Ok(first), Ok(label)) = (
                    t.get_item(0),
                    t.get_item(1).and_then(|l| l.extract::<i64>()),
                ) {
                    if let Some(item) = plain(&first, Some(label)) {
                        return item;
                    }
                }
            }
        }
        // A list of paths or bytes (with labels): a native group, as
        // `DataLoader` hands its batches of files to the batch op.
        if let Ok(list) = obj.cast::<PyList>() {
            if !list.is_empty() {
                let items: Vec<Item> = list
                    .iter()
                    .map(|obj| Item::from_source(obj, None))
                    .take_while(|i| !matches!(i, Item::Py(_)))
                    .collect();
                if items.len() == list.len() {
                    return Item::List(items);
                }
            }
        }
        plain(&obj, None).unwrap_or_else(|| Item::Py(obj.unbind()))
    }

    /// The item as a Python object (at the sink, or for a Python stage).
    pub(crate) fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let labelled = |obj: Bound<'_, PyAny>, label: Option<i64>| -> PyResult<Py<PyAny>> {
            Ok(match label {
                Some(l) => PyTuple::new(py, [obj, l.into_pyobject(py)?.into_any()])?
                    .into_any()
                    .unbind(),
                None => obj.unbind(),
            })
        };
        Ok(match self {
            Item::Py(o) => o,
            Item::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
            Item::Path { path, label, .. } => labelled(path.into_pyobject(py)?.into_any(), label)?,
            Item::Bytes { data, label, .. } => {
                labelled(pyo3::types::PyBytes::new(py, &data).into_any(), label)?
            }
            Item::Located { at, label, .. } => {
                let data = py.detach(|| at.read())?;
                labelled(pyo3::types::PyBytes::new(py, &data).into_any(), label)?
            }
            Item::Image { image, label, .. } => {
                let tensor = image_tensor(py, &image)?;
                labelled(Bound::new(py, tensor)?.into_any(), label)?
            }
            Item::Batch { images, labels } => {
                let images = Bound::new(py, crate::py::dlpack::PyTensor::new(images))?.into_any();
                match labels {
                    Some(l) => PyTuple::new(
                        py,
                        [
                            images,
                            Bound::new(py, crate::py::dlpack::PyTensor::new(l))?.into_any(),
                        ],
                    )?
                    .into_any()
                    .unbind(),
                    None => images.unbind(),
                }
            }
            Item::Loaded {
                batch_no,
                indices,
                images,
                labels,
                skipped,
            } => {
                let tensor = |t: Option<crate::staging::Tensor>| -> PyResult<Bound<'_, PyAny>> {
                    Ok(match t {
                        Some(t) => Bound::new(py, crate::py::dlpack::PyTensor::new(t))?.into_any(),
                        None => py.None().into_bound(py),
                    })
                };
                let skipped = PyList::new(py, skipped)?.into_any();
                let batch_no = batch_no.into_pyobject(py)?.into_any();
                let indices = PyList::new(py, indices)?.into_any();
                PyTuple::new(
                    py,
                    [batch_no, indices, tensor(images)?, tensor(labels)?, skipped],
                )?
                .into_any()
                .unbind()
            }
            Item::Group {
                batch_no,
                indices,
                items,
            } => {
                let list = PyList::empty(py);
                for it in items {
                    list.append(it.into_py(py)?)?;
                }
                let batch_no = batch_no.into_pyobject(py)?.into_any();
                let indices = PyList::new(py, indices)?.into_any();
                PyTuple::new(py, [batch_no, indices, list.into_any()])?
                    .into_any()
                    .unbind()
            }
            Item::List(items) => {
                let list = PyList::empty(py);
                for it in items {
                    list.append(it.into_py(py)?)?;
                }
                list.into_any().unbind()
            }
        })
    }
}

/// A decoded image as a `(H, W, C)` uint8 tensor from the default pool.
fn image_tensor(
    py: Python<'_>,
    image: &crate::image::DecodedImage,
) -> PyResult<crate::py::dlpack::PyTensor> {
    let pool = crate::py::staging::pool_or_default(py, None)?;
    let mut t = crate::staging::Tensor::empty(
        &pool,
        &[image.height, image.width, image.channels],
        crate::dlpack::DType::U8,
    )?;
    t.bytes_mut()
        .expect("a new tensor has no other owner")
        .copy_from_slice(&image.data);
    Ok(crate::py::dlpack::PyTensor::new(t))
}

/// `_core._PlanGroup(batch_no, indices, items)`: a group of an epoch plan
/// as the `DataLoader`'s native executor yields it from its source. Its items
/// (paths or bytes, with labels) are made native here, on the source's
/// thread, which holds the GIL anyway; the batch op then takes the group
/// without the GIL. (Taking the GIL in the op instead waited on the source's
/// thread, up to Python's switch interval, before every batch.)
#[pyclass(name = "_PlanGroup", module = "ferrofeed._core", frozen)]
pub(crate) struct PyPlanGroup {
    item: std::sync::Mutex<Option<Item>>,
}

#[pymethods]
impl PyPlanGroup {
    #[new]
    fn new(batch_no: u64, indices: Vec<u64>, items: &Bound<'_, PyAny>) -> PyResult<Self> {
        let items: Vec<Item> = items
            .try_iter()?
            .map(|item| item.map(|item| Item::from_source(item, None)))
            .collect::<PyResult<_>>()?;
        if items.len() != indices.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "batch {batch_no}: {} items for {} indices",
                items.len(),
                indices.len()
            )));
        }
        let item = Item::Group {
            batch_no,
            indices,
            items,
        };
        Ok(Self {
            item: std::sync::Mutex::new(Some(item)),
        })
    }

    /// One group of the items of `parts`, in the order of `ids`: each part
    /// a group whose indices, plus its offset, are some of `ids` (a
    /// mixture's batch, from its sources' groups). An id no part holds (a
    /// sample one left out) is left out. Each part is used up.
    #[staticmethod]
    fn merge(batch_no: u64, ids: Vec<u64>, parts: Vec<(Bound<'_, Self>, u64)>) -> PyResult<Self> {
        let mut found = std::collections::HashMap::with_capacity(ids.len());
        for (part, offset) in parts {
            let Some(Item::Group { indices, items, .. }) = part.get().take() else {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "batch {batch_no}: a part was merged or sent before"
                )));
            };
            found.extend(indices.into_iter().map(|i| i + offset).zip(items));
        }
        let (mut kept, mut items) = (Vec::with_capacity(ids.len()), Vec::with_capacity(ids.len()));
        for id in ids {
            if let Some(item) = found.remove(&id) {
                kept.push(id);
                items.push(item);
            }
        }
        if !found.is_empty() {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "batch {batch_no}: {} items of the parts are not among the ids",
                found.len()
            )));
        }
        Ok(Self::from_items(batch_no, kept, items))
    }
}

impl PyPlanGroup {
    /// A group of native items made in Rust (a sharded source's window).
    pub(crate) fn from_items(batch_no: u64, indices: Vec<u64>, items: Vec<Item>) -> Self {
        Self {
            item: std::sync::Mutex::new(Some(Item::Group {
                batch_no,
                indices,
                items,
            })),
        }
    }

    /// The group, the first time; `None` after (a source yields it once).
    fn take(&self) -> Option<Item> {
        self.item
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}
