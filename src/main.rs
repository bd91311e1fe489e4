//! The `mcp-health` binary: parse the command line, hand over to the library.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    mcp_health::cli::main()
}
