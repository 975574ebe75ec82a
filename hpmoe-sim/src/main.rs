//! The `hpmoe` command-line tool.

fn main() {
    std::process::exit(hpmoe_sim::cli::main());
}
