//! The process's allocator: mimalloc, asked for blocks as the system allocator asks `malloc`.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{mi_free, mi_malloc, mi_malloc_aligned, mi_realloc, mi_realloc_aligned, mi_zalloc, mi_zalloc_aligned};

/// Every mimalloc block is at least this aligned: block sizes are whole words, and a page's
/// first block is 16-byte aligned.
const WORD_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc, asked as Rust's own system allocator asks `malloc`: plainly when the alignment is
/// one every block has, aligned only past it. `mimalloc::MiMalloc` asks `mi_malloc_aligned` for
/// everything, and mimalloc 3 serves an aligned request whose size class is not a power of two
/// (40, 48, 80, 96 … bytes) by over-allocating `size + align - 1` bytes through its generic
/// path: a 48-byte object then takes a 64-byte block, an 80-byte one a 96-byte block. The
/// binary and the benchmarks use this one, so that what they measure is what runs.
pub struct Mimalloc;

// SAFETY: every block comes from mimalloc and goes back to it (`mi_free` takes any of its
// blocks, aligned or not); a plain request is made only for alignments every block has.
unsafe impl GlobalAlloc for Mimalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD_ALIGN {
            mi_malloc(layout.size()) as *mut u8
        } else {
            mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.align() <= WORD_ALIGN {
            mi_zalloc(layout.size()) as *mut u8
        } else {
            mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi_free(ptr as *mut c_void)
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() <= WORD_ALIGN {
            mi_realloc(ptr as *mut c_void, new_size) as *mut u8
        } else {
            mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each layout's block is aligned as asked, holds its bytes, keeps them through a
    /// reallocation, and zeroed blocks are zero: plain requests below the word, aligned ones
    /// above it.
    #[test]
    fn blocks_are_aligned_as_asked_and_keep_their_bytes() {
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [1, 7, 8, 24, 40, 48, 100, 4000, 70_000] {
                let layout = Layout::from_size_align(size, align).expect("layout");
                // SAFETY: non-zero sizes; each block is written within its size and freed once.
                unsafe {
                    let p = Mimalloc.alloc(layout);
                    assert!(!p.is_null() && (p as usize).is_multiple_of(align), "alloc {size} aligned {align}: {p:?}");
                    std::ptr::write_bytes(p, 0xa5, size);
                    let q = Mimalloc.realloc(p, layout, size * 3);
                    assert!(!q.is_null() && (q as usize).is_multiple_of(align), "realloc {size} aligned {align}: {q:?}");
                    assert!(std::slice::from_raw_parts(q, size).iter().all(|b| *b == 0xa5), "realloc kept the bytes");
                    Mimalloc.dealloc(q, Layout::from_size_align(size * 3, align).expect("layout"));
                    let z = Mimalloc.alloc_zeroed(layout);
                    assert!(!z.is_null() && (z as usize).is_multiple_of(align), "zalloc {size} aligned {align}: {z:?}");
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|b| *b == 0), "zeroed");
                    Mimalloc.dealloc(z, layout);
                }
            }
        }
    }

    /// A word-aligned request of a size class's own size that is not a power of two takes a
    /// block of that class: not the next class up, where `mi_malloc_aligned` puts it (its
    /// `size + 7` bytes).
    #[test]
    fn word_aligned_blocks_take_their_own_size_class() {
        for size in [48, 80, 96, 112, 160, 192] {
            let layout = Layout::from_size_align(size, 8).expect("layout");
            // SAFETY: a non-zero size, freed once.
            unsafe {
                let p = Mimalloc.alloc(layout);
                let usable = libmimalloc_sys::mi_usable_size(p as *const c_void);
                Mimalloc.dealloc(p, layout);
                assert_eq!(usable, size, "a {size}-byte block");
            }
        }
    }
}
