//! The `mcp-health` binary: parse the command line, hand over to the library.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

extern "C" {
    /// mimalloc's option setter (mimalloc.h); options are atomics, safe to set at any time.
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// `mi_option_purge_delay` in mimalloc v2's `mi_option_t` (the version libmimalloc-sys builds by
/// default): how long freed pages are kept before they are returned to the OS (default 10 ms, and
/// only on later activity of the thread that freed them).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// Under a memory limit, freed memory goes back to the OS at once: measured with 64 refused 4 MiB
/// requests, the default kept ~100 MiB of freed buffers resident for good, which the limiter then
/// (rightly) counted as used and refused everything.
fn return_freed_memory_at_once() {
    // SAFETY: a valid option index and value; mimalloc is this process's allocator.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

fn main() -> std::process::ExitCode {
    mcp_health::receive::memory::set_allocator_hook(return_freed_memory_at_once);
    mcp_health::cli::main()
}
