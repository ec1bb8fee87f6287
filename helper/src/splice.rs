//! What `bridge` and `relay` share: once connected, say so on stdout, then copy bytes unchanged
//! between this process's stdin/stdout and a stream, both ways, and end as soon as either
//! direction ends. It interprets nothing.

use std::io::{Read, Write};

/// Writes `greeting`, then splices stdin into `to_stream` (on a thread) and `from_stream` into
/// stdout. When stdin ends, `on_stdin_end` runs on the stream and the process exits 0; when the
/// stream ends, the answer is 0. 1 when the greeting cannot be written.
pub fn splice<S: Read + Write + Send + 'static>(
    greeting: &[u8],
    mut from_stream: S,
    mut to_stream: S,
    on_stdin_end: fn(&S),
) -> i32 {
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(greeting)
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return 1;
    }
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to_stream.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        on_stdin_end(&to_stream);
        std::process::exit(0);
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from_stream.read(&mut buf) {
            Ok(0) | Err(_) => return 0,
            Ok(n) => {
                if stdout
                    .write_all(&buf[..n])
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return 0;
                }
            }
        }
    }
}
