//! An allocator that counts, per thread, the bytes held and the most held at once: what a
//! cache costs per object, measured in process. A test binary makes it its allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: testkit::alloc::Counting = testkit::alloc::Counting;
//! ```
//!
//! Counting per thread keeps the other tests of the binary out of the count.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
};

pub struct Counting;

thread_local! {
    static HELD: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

// SAFETY: every call goes to `System`; the counters are plain thread-local cells.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn count(delta: isize) {
    // try_with: a thread being torn down has no counters any more.
    let _ = HELD.try_with(|h| {
        let now = h.get() + delta;
        h.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

/// Bytes this thread holds now (allocated less freed, since it started).
pub fn held() -> isize {
    HELD.with(Cell::get)
}

/// The most this thread held at once since the last [`reset_peak`].
pub fn peak() -> isize {
    PEAK.with(Cell::get)
}

/// Restarts the peak from what is held now.
pub fn reset_peak() {
    PEAK.with(|p| p.set(held()));
}
