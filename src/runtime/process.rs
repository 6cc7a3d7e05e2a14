//! The one fork rule: a value a process keeps for its life, made on first
//! use and made again in a forked child.
//!
//! A forked child inherits a thread pool's or a runtime's memory but none of
//! its threads (only the thread that called `fork` goes on), and a client's
//! connection pool holds sockets shared with the parent. Used there, a tokio
//! runtime hangs (the failure `LitData` and others met) and a pool's jobs
//! never run. So each such value is tagged with the pid of the process that
//! made it: a process whose pid differs makes its own on first use, and
//! leaks the inherited one. Dropping it there would join or signal threads
//! that do not exist, through locks that a parent thread may have held at
//! the fork.
//!
//! The pid is compared on every look-up (a `getpid` call), so the rule needs
//! no `fork` hook and holds however the process was forked (`os.fork`,
//! `multiprocessing`, a C library). The value sits behind one mutex, held to
//! compare the pid and clone a handle (or, once per process, to make the
//! value): a fork at that very moment, from another thread, would leave the
//! child's copy locked (the same holds for any lock of the process, the
//! allocator's included; Python warns against forking a process with
//! threads).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A value this process keeps, made on first use in each process (see the
/// module's docs).
///
/// # Examples
///
/// ```
/// use ferrofeed::runtime::PerProcess;
/// static COUNTERS: PerProcess<std::sync::atomic::AtomicU64> = PerProcess::new();
/// let a = COUNTERS.get_or_init(Default::default);
/// let b = COUNTERS.get_or_init(|| unreachable!("made once per process"));
/// assert!(std::sync::Arc::ptr_eq(&a, &b));
/// ```
pub struct PerProcess<T> {
    /// The pid of the process that made the value, and the value.
    slot: Mutex<Option<(u32, Arc<T>)>>,
}

impl<T> PerProcess<T> {
    /// None made yet.
    pub const fn new() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }

    /// This process's value, made by `make` (under the lock, so once) if it
    /// has none yet.
    ///
    /// # Errors
    ///
    /// `make`'s error: nothing is kept, and the next call tries again.
    pub fn get_or_try_init<E>(&self, make: impl FnOnce() -> Result<T, E>) -> Result<Arc<T>, E> {
        let mut slot = self.lock();
        if let Some((_, value)) = slot.as_ref() {
            return Ok(Arc::clone(value));
        }
        let value = Arc::new(make()?);
        *slot = Some((std::process::id(), Arc::clone(&value)));
        Ok(value)
    }

    /// This process's value, made by `make` if it has none yet.
    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> Arc<T> {
        let value: Result<Arc<T>, std::convert::Infallible> = self.get_or_try_init(|| Ok(make()));
        match value {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }

    /// This process's value, if it has made one (a value made by the parent
    /// of a forked child is not this process's).
    pub fn get(&self) -> Option<Arc<T>> {
        self.lock().as_ref().map(|(_, value)| Arc::clone(value))
    }

    /// The slot, emptied of a value that another process (the parent of a
    /// forked child) made: that one is leaked, never dropped.
    fn lock(&self) -> MutexGuard<'_, Option<(u32, Arc<T>)>> {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        if slot
            .as_ref()
            .is_some_and(|(pid, _)| *pid != std::process::id())
        {
            std::mem::forget(slot.take());
        }
        slot
    }

    /// Puts `value` in the slot as if process `pid` had made it (a parent,
    /// for the tests of the fork rule).
    #[cfg(test)]
    pub(super) fn made_by(&self, pid: u32, value: T) {
        *self.slot.lock().unwrap() = Some((pid, Arc::new(value)));
    }
}

impl<T> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn made_once_per_process() {
        let kept: PerProcess<usize> = PerProcess::new();
        assert!(kept.get().is_none());
        let mut makes = 0;
        let a = kept.get_or_init(|| {
            makes += 1;
            7
        });
        let b = kept.get_or_init(|| {
            makes += 1;
            8
        });
        assert_eq!((*a, *b, makes), (7, 7, 1));
        assert!(Arc::ptr_eq(&a, &kept.get().unwrap()));
    }

    #[test]
    fn a_failed_make_keeps_nothing() {
        let kept: PerProcess<usize> = PerProcess::new();
        assert_eq!(kept.get_or_try_init(|| Err("no")), Err("no"));
        assert!(kept.get().is_none());
        assert_eq!(*kept.get_or_try_init(|| Ok::<_, ()>(3)).unwrap(), 3);
    }

    #[test]
    fn a_parents_value_is_not_this_process_and_is_leaked_not_dropped() {
        // The value holds a handle of `marker`: dropping it would let that go.
        let marker = Arc::new(());
        let kept: PerProcess<Arc<()>> = PerProcess::new();
        // As a forked child sees it: a value its parent (another pid) made.
        kept.made_by(std::process::id().wrapping_add(1), Arc::clone(&marker));
        assert!(
            kept.get().is_none(),
            "the parent's value served in the child"
        );
        let mine = kept.get_or_init(|| Arc::new(()));
        assert_eq!(Arc::strong_count(&marker), 2, "the parent's value dropped");
        assert!(Arc::ptr_eq(&mine, &kept.get().unwrap()));
    }
}
