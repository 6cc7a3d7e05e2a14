"""The compiled core's names that `_core_sources.pyi` describes, re-exported from `_core`.

The stub of `ferrofeed._core` is two files (the arena, plans, seeds and sharded sources in
`_core_sources.pyi`, the rest in `_core.pyi`, which re-exports these); this module gives the
second stub a module at run time, so that stubtest checks it against the compiled classes.
Code imports these names from `_core`.
"""

# Every name of the compiled module (its `__all__`, private names included): stubtest checks
# the ones the stub describes, and names whose classes belong to `_core` are not this
# module's own.
from ._core import *  # noqa: F403
