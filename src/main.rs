use clap::Parser;

fn main() -> std::process::ExitCode {
    fragscope::cli::run(fragscope::cli::Cli::parse())
}
