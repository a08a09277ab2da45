from collections.abc import Sequence
from typing import Any

TOGGLED: object
END: object

def enter_flat(
    opts: Sequence[Any],
    optimizer: Any,
    inner: Any,
    seq: tuple[Any, ...],
    managed: tuple[Any, ...],
    free: tuple[Any, ...],
    /,
) -> list[Any] | tuple[bool, ...]: ...
def leave_flat(
    opts: Sequence[Any],
    optimizer: Any,
    inner: Any,
    record: Any,
    vals: tuple[bool, ...],
    seq: tuple[Any, ...],
    last_vals: tuple[bool, ...] | None,
    last_record: dict[Any, bool],
    restore: tuple[Any, ...],
    restore_vals: tuple[bool, ...],
    /,
) -> bool: ...
