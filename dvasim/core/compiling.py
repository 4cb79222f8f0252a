"""The one piece of mypyc a module of the optional compiled core (:mod:`dvasim.compiled`) names in its source:
the class decorator ``mypyc_attr``, from ``mypy_extensions`` where it is installed (it comes with mypy, which
builds the compiled core), else a no-op, so the pure package does not depend on it.

``@mypyc_attr(allow_interpreted_subclasses=True)`` lets pure-Python classes (a user's policy, a test's) subclass
a compiled class; the pure class ignores it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:
    try:
        from mypy_extensions import mypyc_attr
    except ImportError:  # the pure package without mypy: the decorator does nothing
        def mypyc_attr(*attrs: Any, **kwattrs: Any) -> Any:
            return lambda cls: cls

__all__ = ["mypyc_attr"]
