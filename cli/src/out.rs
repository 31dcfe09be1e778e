//! Standard output of every command. A reader that goes away before the output ends
//! (`sandmesh ws ls S | head`) ends the command at once, quietly, with the status a shell
//! reports for a program killed by SIGPIPE: what a Unix filter does. Rust ignores SIGPIPE, so
//! a write to the closed pipe fails instead, and `println!` panicked on it ("failed printing
//! to stdout"). The signal is not restored instead: `sandmesh up` runs the services in this
//! process, and their writes to a closed pipe (a child's stdin) must fail, not kill the mesh.
//!
//! Commands print with [`outln!`] and [`out!`], or write to [`stdout()`]; `print!` and
//! `println!` are denied in this crate.

use std::io::Write;

/// 128 + SIGPIPE (13): the status a shell shows for a program the signal ended.
pub const READER_GONE_STATUS: i32 = 141;

/// The process's standard output, locked; a write or flush that finds the reader gone ends
/// the process (see the module's comment).
pub struct Stdout(std::io::StdoutLock<'static>);

pub fn stdout() -> Stdout {
    Stdout(std::io::stdout().lock())
}

/// A write's result, unless it says the reader went away: then the command is over.
fn unless_gone<T>(r: std::io::Result<T>) -> std::io::Result<T> {
    match r {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(READER_GONE_STATUS)
        }
        r => r,
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        unless_gone(self.0.write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        unless_gone(self.0.flush())
    }
}

/// `print!`'s work through [`stdout()`]; any failure but a gone reader panics as `print!`
/// does.
pub fn print(args: std::fmt::Arguments<'_>) {
    if let Err(e) = stdout().write_fmt(args) {
        panic!("failed printing to stdout: {e}");
    }
}

/// `print!` that ends the command quietly when its reader goes away.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::print(format_args!($($arg)*))
    };
}

/// `println!` that ends the command quietly when its reader goes away.
macro_rules! outln {
    () => {
        $crate::out::print(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::print(format_args!("{}\n", format_args!($($arg)*)))
    };
}
