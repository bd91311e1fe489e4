//! The `mcp-health` binary: parse the command line, hand over to the library.

use libmimalloc_sys::{mi_collect, mi_option_set, mi_option_t};

#[global_allocator]
static GLOBAL: mcp_health::Mimalloc = mcp_health::Mimalloc;

/// `mi_option_purge_delay` in mimalloc's `mi_option_t` (index 15 in both v2 and v3, the v3 that
/// libmimalloc-sys builds by default): how long freed pages are kept before they are returned
/// to the OS (default 10 ms; negative: never). The binding (0.1.49) declares the options on
/// either side of it but not this one.
const MI_OPTION_PURGE_DELAY: mi_option_t = 15;

/// Purge delay far below the memory limit: never. Chains live about a `decision_wait` and their
/// pages are allocated again as soon as they are freed; every page returned was faulted in and
/// zeroed again a moment later. Measured with the MCP-only load (one request in flight, limit
/// 4000 MiB): mimalloc's own 10 ms gave 187 000 page faults in a 5 s window and 1000 ms gave
/// 51 000, never gave 9, and the service's CPU per span fell by a fifth. What is kept is bounded:
/// the memory limiter asks for prompt return once the process holds a quarter of its soft limit.
const KEEP_FREED: std::ffi::c_long = -1;

/// Near a memory limit, freed memory goes back to the OS at once: measured with 64 refused 4 MiB
/// requests, the allocator's delay kept freed buffers resident, which the limiter then (rightly)
/// counted as used, refusing requests it had room for. Far below the limit, the allocator keeps
/// it (see [`KEEP_FREED`]).
fn return_freed_memory(at_once: bool) {
    let delay = if at_once { 0 } else { KEEP_FREED };
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

/// A runtime thread goes idle: hand back what it freed (at most every IDLE_COLLECT_EVERY), to the
/// OS while the process is near its memory limit (far below it the allocator keeps freed memory,
/// see [`KEEP_FREED`]). Without it a thread that freed a burst (requests refused, chains decided)
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
