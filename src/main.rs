//! The `mcp-health` binary: parse the command line, hand over to the library.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use libmimalloc_sys::{mi_collect, mi_option_set, mi_option_t};

/// `mi_option_purge_delay` in mimalloc's `mi_option_t` (index 15 in both v2 and v3, the v3 that
/// libmimalloc-sys builds by default): how long freed pages are kept before they are returned
/// to the OS (default 10 ms, and only on later activity of the thread that freed them). The
/// binding (0.1.49) declares the options on either side of it but not this one.
const MI_OPTION_PURGE_DELAY: mi_option_t = 15;

/// mimalloc's own default purge delay, in milliseconds.
const DEFAULT_PURGE_DELAY_MS: std::ffi::c_long = 10;

/// Near a memory limit, freed memory goes back to the OS at once: measured with 64 refused 4 MiB
/// requests, the allocator's delay kept freed buffers resident, which the limiter then (rightly)
/// counted as used, refusing requests it had room for. Far below the limit, the delay saves a
/// system call per freed page and a page fault per page allocated again.
fn return_freed_memory(at_once: bool) {
    let delay = if at_once { 0 } else { DEFAULT_PURGE_DELAY_MS };
    // SAFETY: a valid option index and value; mimalloc is this process's allocator.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, delay) }
}

/// Least time between two collections on one thread going idle: a busy runtime parks its
/// threads thousands of times a second, and a forced collection visits the thread's pages
/// (with a million chains in flight, some thousands): at most once a second keeps it negligible.
const IDLE_COLLECT_EVERY: std::time::Duration = std::time::Duration::from_millis(1000);

thread_local! {
    static LAST_IDLE_COLLECT: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
}

/// A runtime thread goes idle: hand back to the OS what it freed (at most every
/// IDLE_COLLECT_EVERY). Without it a thread that freed a burst (requests refused, chains decided)
/// and then idled kept that memory resident until it was busy again.
fn collect_on_idle() {
    let now = std::time::Instant::now();
    if LAST_IDLE_COLLECT.get().is_some_and(|t| now.duration_since(t) < IDLE_COLLECT_EVERY) {
        return;
    }
    LAST_IDLE_COLLECT.set(Some(now));
    // SAFETY: mimalloc is this process's allocator; collecting the calling thread's heap is
    // allowed at any time.
    unsafe { mi_collect(true) }
}

fn main() -> std::process::ExitCode {
    mcp_health::main(mcp_health::Allocator { return_freed_memory, collect_on_idle })
}
