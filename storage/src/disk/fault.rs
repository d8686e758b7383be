use std::cell::Cell;

thread_local! {
    static NEXT: Cell<Option<i32>> = const { Cell::new(None) };
}

/// The next `submit_queued` on this thread fails with `errno`, taking
/// nothing (both entries stay queued, as after a real EAGAIN).
pub fn refuse_next(errno: i32) {
    NEXT.with(|n| n.set(Some(errno)));
}

pub fn take() -> Option<i32> {
    NEXT.with(|n| n.take())
}
