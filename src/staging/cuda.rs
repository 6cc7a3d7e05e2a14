//! Page-locked host memory through the CUDA driver, loaded at run time.
//!
//! The wheel never links CUDA. With the `cuda` feature (on by default) this
//! module reaches the driver through cudarc's dynamic loading, which dlopens
//! `libcuda` on first use; cudarc is used with only its raw driver bindings,
//! which cost about 6 s of build time and one extra crate (libloading).
//!
//! # Probing
//!
//! Nothing CUDA is touched until a pool that wants pinned memory allocates
//! its first buffer. Then, once per process, [`probe`]:
//!
//! 1. honours `FERROFEED_DISABLE_CUDA=1` (plain memory, no CUDA call at all);
//! 2. checks that the driver library can be dlopened (`libcuda.so.1` and the
//!    other names cudarc's loader tries, in the same order, so the loader
//!    cannot fail afterwards: cudarc panics when the library is missing, and
//!    this check is what makes that impossible);
//! 3. calls `cuInit`, finds device 0 and retains its primary context (the one
//!    PyTorch and JAX use), then allocates and frees one small pinned block,
//!    so that every driver symbol used later is resolved here.
//!
//! Any failure, including a panic inside the bindings, leaves the process on
//! plain memory, with the reason kept for [`status`].
//!
//! # Fork
//!
//! CUDA cannot be used in a child forked after `cuInit`. The probe result is
//! tagged with the process id: in a forked child, pinned memory is reported
//! unavailable and no CUDA call is made, and pinned blocks inherited from the
//! parent are never freed through the driver (see
//! [`super::host::HostAlloc`]).

use std::ptr::NonNull;
use std::sync::OnceLock;

/// The environment variable that turns pinned memory off.
pub const DISABLE_ENV: &str = "FERROFEED_DISABLE_CUDA";

/// The process id, for fork detection.
pub(crate) fn current_pid() -> i32 {
    rustix::process::getpid().as_raw_nonzero().get()
}

/// A usable driver: the retained primary context of device 0.
#[derive(Debug)]
struct Driver {
    #[cfg(feature = "cuda")]
    ctx: Context,
    /// The process that initialized CUDA.
    pid: i32,
}

/// `CUcontext` is a raw pointer; the driver allows using a context from any
/// thread (that is what pushing it does).
#[cfg(feature = "cuda")]
#[derive(Debug, Clone, Copy)]
struct Context(cudarc::driver::sys::CUcontext);

// SAFETY: a CUDA context handle may be made current on any thread; the
// handle itself is an opaque token that is never dereferenced by Rust.
#[cfg(feature = "cuda")]
unsafe impl Send for Context {}
// SAFETY: as above; the driver serializes its own use of the context.
#[cfg(feature = "cuda")]
unsafe impl Sync for Context {}

static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();

/// The driver, probing it on first use; `Err` says why pinned memory is
/// unavailable in this process.
fn driver() -> Result<&'static Driver, String> {
    let d = DRIVER.get_or_init(probe).as_ref().map_err(Clone::clone)?;
    if d.pid != current_pid() {
        return Err("CUDA was initialized before this process was forked; \
                    a forked child uses plain memory"
            .to_owned());
    }
    Ok(d)
}

/// Whether pinned memory can be allocated in this process (probes the
/// driver on first call, which initializes CUDA when it is present).
pub fn pinned_available() -> bool {
    driver().is_ok()
}

/// `Ok(())` when pinned memory is available, or the reason it is not.
/// Probes like [`pinned_available`].
///
/// # Errors
///
/// The reason, as text: no driver library, `cuInit` failed, no device,
/// disabled by [`DISABLE_ENV`], built without the `cuda` feature, or a
/// forked child.
pub fn status() -> Result<(), String> {
    driver().map(|_| ())
}

/// Whether the probe already ran in this process (so asking does not touch
/// CUDA).
pub fn probed() -> bool {
    DRIVER.get().is_some()
}

fn disabled_by_env() -> bool {
    std::env::var_os(DISABLE_ENV).is_some_and(|v| !v.is_empty() && v != "0")
}

#[cfg(not(feature = "cuda"))]
fn probe() -> Result<Driver, String> {
    if disabled_by_env() {
        return Err(format!("disabled by {DISABLE_ENV}"));
    }
    Err("ferrofeed was built without the `cuda` feature".to_owned())
}

#[cfg(feature = "cuda")]
fn probe() -> Result<Driver, String> {
    if disabled_by_env() {
        return Err(format!("disabled by {DISABLE_ENV}"));
    }
    // The bindings panic on a missing symbol; never let that escape.
    std::panic::catch_unwind(probe_driver)
        .unwrap_or_else(|_| Err("the CUDA driver probe panicked".to_owned()))
}

#[cfg(feature = "cuda")]
fn check(r: cudarc::driver::sys::CUresult, what: &str) -> Result<(), String> {
    if r == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed: {r:?}"))
    }
}

#[cfg(feature = "cuda")]
fn probe_driver() -> Result<Driver, String> {
    use cudarc::driver::sys;

    // SAFETY: dlopens and dlcloses the candidate library names; loading the
    // CUDA driver library runs no code of ours and has no side effect we
    // rely on.
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda.so.1 could not be loaded)".to_owned());
    }
    // SAFETY (all the driver calls below): the library is present, so the
    // bindings load it instead of panicking; each call gets valid out
    // pointers to locals, as the driver API requires.
    unsafe {
        check(sys::cuInit(0), "cuInit")?;
        let mut count = 0;
        check(sys::cuDeviceGetCount(&raw mut count), "cuDeviceGetCount")?;
        if count < 1 {
            return Err("the CUDA driver sees no device".to_owned());
        }
        let mut dev = 0;
        check(sys::cuDeviceGet(&raw mut dev, 0), "cuDeviceGet")?;
        let mut ctx = std::ptr::null_mut();
        check(
            sys::cuDevicePrimaryCtxRetain(&raw mut ctx, dev),
            "cuDevicePrimaryCtxRetain",
        )?;
        // The primary context is retained for the life of the process.
        let driver = Driver {
            ctx: Context(ctx),
            pid: current_pid(),
        };
        // One allocation round trip resolves every symbol used later.
        let p = host_alloc_with(&driver, 64)?;
        host_free_with(&driver, p);
        Ok(driver)
    }
}

/// Runs `f` with the driver's context current on this thread, restoring the
/// thread's previous context after.
#[cfg(feature = "cuda")]
fn with_context<T>(d: &Driver, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    use cudarc::driver::sys;
    // SAFETY: `d.ctx` is a retained, live context; push and pop are paired,
    // so the calling thread's context stack is left as it was.
    unsafe {
        check(sys::cuCtxPushCurrent_v2(d.ctx.0), "cuCtxPushCurrent")?;
        let r = f();
        let mut popped = std::ptr::null_mut();
        let pop = check(sys::cuCtxPopCurrent_v2(&raw mut popped), "cuCtxPopCurrent");
        let v = r?;
        pop?;
        Ok(v)
    }
}

#[cfg(feature = "cuda")]
fn host_alloc_with(d: &Driver, size: usize) -> Result<NonNull<u8>, String> {
    use cudarc::driver::sys;
    with_context(d, || {
        let mut p = std::ptr::null_mut();
        // SAFETY: a valid out pointer; PORTABLE makes the block pinned for
        // every context, not only the primary one.
        check(
            unsafe { sys::cuMemHostAlloc(&raw mut p, size, sys::CU_MEMHOSTALLOC_PORTABLE) },
            "cuMemHostAlloc",
        )?;
        NonNull::new(p.cast::<u8>()).ok_or_else(|| "cuMemHostAlloc returned null".to_owned())
    })
}

#[cfg(feature = "cuda")]
fn host_free_with(d: &Driver, p: NonNull<u8>) {
    use cudarc::driver::sys;
    // Nothing useful can be done if freeing fails: the block is leaked.
    let _ = with_context(d, || {
        // SAFETY: `p` came from cuMemHostAlloc in this process and is freed
        // once (caller's promise).
        check(
            unsafe { sys::cuMemFreeHost(p.as_ptr().cast()) },
            "cuMemFreeHost",
        )
    });
}

/// Allocates `size` bytes of pinned host memory (page-aligned, so 64-byte
/// aligned). `Err` when pinned memory is unavailable or the driver refuses.
pub(crate) fn host_alloc(size: usize) -> Result<NonNull<u8>, String> {
    #[cfg(feature = "cuda")]
    {
        host_alloc_with(driver()?, size)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = size;
        driver().and_then(|_| Err("ferrofeed was built without the `cuda` feature".to_owned()))
    }
}

/// Frees a block of [`host_alloc`]. In a forked child (or if the driver is
/// gone) the block is leaked instead: the driver cannot be called there.
///
/// # Safety
///
/// `p` came from [`host_alloc`] in this process and is not used afterwards.
pub(crate) unsafe fn host_free(p: NonNull<u8>) {
    if let Ok(d) = driver() {
        #[cfg(feature = "cuda")]
        host_free_with(d, p);
        #[cfg(not(feature = "cuda"))]
        let _ = (d, p);
    }
}

/// A host memory range page-locked for CUDA with `cuMemHostRegister`, so
/// that copies from it to a GPU run asynchronously by DMA; unregistered when
/// dropped (in the process that registered it: a forked child only forgets
/// it, as the driver cannot be called there).
#[derive(Debug)]
pub(crate) struct Registration {
    ptr: NonNull<u8>,
    pid: i32,
}

// SAFETY: the pointer is only an address handed back to the driver on drop,
// never dereferenced by Rust; the driver allows unregistering from any
// thread (the context is pushed for the call).
unsafe impl Send for Registration {}
// SAFETY: as above; `&Registration` gives no access to the memory.
unsafe impl Sync for Registration {}

/// Page-locks the `len` bytes at `ptr` for CUDA (`CU_MEMHOSTREGISTER_PORTABLE`:
/// for every context). `Err` says why not: pinned memory unavailable in this
/// process (no driver, disabled, a forked child) or the driver refused
/// (`RLIMIT_MEMLOCK`, say).
///
/// # Safety
///
/// The range is mapped, and stays mapped until the returned `Registration`
/// is dropped (drop it before unmapping).
pub(crate) unsafe fn register(ptr: NonNull<u8>, len: usize) -> Result<Registration, String> {
    #[cfg(feature = "cuda")]
    {
        use cudarc::driver::sys;
        let d = driver()?;
        with_context(d, || {
            // SAFETY: the caller's promise: the range is mapped for as long
            // as the registration lives; the driver only pins its pages.
            check(
                unsafe {
                    sys::cuMemHostRegister_v2(
                        ptr.as_ptr().cast(),
                        len,
                        sys::CU_MEMHOSTREGISTER_PORTABLE,
                    )
                },
                "cuMemHostRegister",
            )
        })?;
        Ok(Registration { ptr, pid: d.pid })
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (ptr, len);
        driver().and_then(|_| Err("ferrofeed was built without the `cuda` feature".to_owned()))
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // In a forked child this is the parent's registration: not ours to
        // undo (and the driver cannot be called there).
        if self.pid == current_pid() {
            unregister(self.ptr);
        }
    }
}

#[cfg(feature = "cuda")]
fn unregister(ptr: NonNull<u8>) {
    use cudarc::driver::sys;
    if let Ok(d) = driver() {
        // Nothing useful can be done if unregistering fails.
        let _ = with_context(d, || {
            // SAFETY: `ptr` was registered in this process by `register`
            // and is unregistered once, here, while still mapped (the
            // promise of `register`'s caller).
            check(
                unsafe { sys::cuMemHostUnregister(ptr.as_ptr().cast()) },
                "cuMemHostUnregister",
            )
        });
    }
}

#[cfg(not(feature = "cuda"))]
fn unregister(_: NonNull<u8>) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without a driver (CI, this container) the probe says
    /// why, never panics, and allocation falls back to an error.
    #[test]
    fn probe_never_panics_and_explains() {
        match status() {
            Ok(()) => assert!(pinned_available()),
            Err(why) => {
                assert!(!why.is_empty());
                assert!(!pinned_available());
                assert!(host_alloc(64).is_err());
            }
        }
        assert!(probed());
    }

    /// Without a driver (CI) registering fails with the probe's reason;
    /// with one, a mapped range registers and unregisters on drop.
    #[test]
    fn register_explains_or_pins() {
        let mut block = vec![0u8; 1 << 16];
        let ptr = NonNull::new(block.as_mut_ptr()).unwrap();
        // SAFETY: `block` outlives the registration, dropped just below.
        let r = unsafe { register(ptr, block.len()) };
        match (status(), r) {
            (Ok(()), Ok(reg)) => drop(reg),
            (Err(why), Err(e)) => assert_eq!(why, e),
            (s, r) => panic!("probe {s:?} but registration {r:?}"),
        }
        block[0] = 1;
    }

    #[test]
    fn pid_is_positive() {
        assert!(current_pid() > 0);
    }
}
