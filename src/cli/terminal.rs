//! The local terminal of an interactive session (`exec -it`, `attach -it`): raw mode for as long
//! as the session lasts, restored on every way out that runs destructors (the session turns
//! SIGTERM and SIGHUP into an ordinary end for that reason), and the terminal's size. Only this
//! file calls termios; it knows nothing of sandboxes or the network.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

/// Standard input in raw mode (no echo, no line editing, no signals from keys: Ctrl-C goes to
/// the remote side as a byte) until dropped.
pub struct RawMode {
    fd: RawFd,
    saved: libc::termios,
}

impl RawMode {
    pub fn enter() -> io::Result<RawMode> {
        let fd = io::stdin().as_raw_fd();
        // SAFETY: termios is plain data; tcgetattr fills it or fails.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd is our stdin; `saved` is a valid termios to write into.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut raw = saved;
        // SAFETY: `raw` is a valid termios.
        unsafe { libc::cfmakeraw(&mut raw) };
        // SAFETY: fd is our stdin; `raw` is a valid termios.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RawMode { fd, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the settings read from the same descriptor.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// The size of the terminal on standard output (or input): (columns, rows).
pub fn size() -> Option<(u16, u16)> {
    [io::stdout().as_raw_fd(), io::stdin().as_raw_fd()]
        .into_iter()
        .find_map(|fd| {
            // SAFETY: winsize is plain data; TIOCGWINSZ fills it or fails.
            let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
            // SAFETY: fd is one of ours; `ws` is a valid winsize to write into.
            let ok = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0;
            (ok && ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
        })
}
