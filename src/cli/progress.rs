//! What `apply --wait` and `wait` show while they wait: the image pull a sandbox waits for, from
//! its `status.imagePull` (`bytesDone`, `bytesTotal`) and its `ImagePulled` condition. On a
//! terminal it is one bar redrawn in place on stderr; anywhere else (a pipe, a CI log) it is a
//! plain line when the pull is first seen, one for each further tenth of it, and one when it is
//! done, so that a log stays short and readable. Standard output is left to the results.
//!
//! The rendering is pure ([`bar_line`], [`PullView::plain_lines`]) so it is tested without a
//! terminal; [`Progress`] only decides where it goes.

use std::io::{IsTerminal, Write};

use serde_json::Value;

use super::util::bytes;

/// A pull as one poll of a resource shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullView {
    pub image: String,
    pub done: u64,
    pub total: u64,
    /// The `ImagePulled` condition is `True`: the image is there.
    pub finished: bool,
}

impl PullView {
    /// The pull `item` (a resource as the server answers it) reports, if it is a sandbox that
    /// waits or waited for one.
    pub fn of(item: &Value) -> Option<PullView> {
        let progress = item["status"].get("imagePull")?;
        let condition = item["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "ImagePulled")?;
        Some(PullView {
            image: item["spec"]["image"]
                .as_str()
                .unwrap_or("the image")
                .to_string(),
            done: progress["bytesDone"].as_u64().unwrap_or(0),
            total: progress["bytesTotal"].as_u64().unwrap_or(0),
            finished: condition["status"] == "True",
        })
    }

    /// Per mille of the bytes known so far; `None` before the registry named any size.
    fn permille(&self) -> Option<u64> {
        if self.finished {
            return Some(1000);
        }
        (self.total > 0).then(|| (self.done.min(self.total) * 1000) / self.total)
    }

    fn amounts(&self) -> String {
        match (self.finished, self.total) {
            (true, _) => bytes(self.total.max(self.done)),
            (false, 0) => format!("{} so far", bytes(self.done)),
            (false, total) => format!("{} of {}", bytes(self.done), bytes(total)),
        }
    }
}

/// One line of a terminal's bar, at most `columns` characters wide:
/// `sandbox/demo  pulling IMAGE  [######------]  12.0MiB of 24.0MiB  50%`.
pub fn bar_line(what: &str, pull: &PullView, columns: usize) -> String {
    let verb = if pull.finished { "pulled" } else { "pulling" };
    let percent = match pull.permille() {
        Some(p) => format!("{:>3}%", p / 10),
        None => "  ?%".to_string(),
    };
    let head = format!("{what}  {verb} {}", pull.image);
    let tail = format!("{}  {percent}", pull.amounts());
    // Two spaces either side of the bar and its brackets.
    let fixed = head.chars().count() + tail.chars().count() + 6;
    let width = columns.saturating_sub(fixed).min(40);
    if width < 10 {
        // Too narrow for a bar: the figures only, cut to the width.
        let line = format!("{head}  {tail}");
        return line.chars().take(columns.max(1)).collect();
    }
    let filled = match pull.permille() {
        Some(p) => (width as u64 * p / 1000) as usize,
        None => 0,
    };
    format!(
        "{head}  [{}{}]  {tail}",
        "#".repeat(filled),
        "-".repeat(width - filled)
    )
}

/// The plain lines a new poll adds, given the tenth of the pull last reported (`None`: nothing
/// reported yet); returns them and the tenth now reported.
pub fn plain_lines(
    what: &str,
    pull: &PullView,
    reported: Option<u64>,
) -> (Vec<String>, Option<u64>) {
    if pull.finished {
        if reported == Some(10) {
            return (Vec::new(), reported);
        }
        let line = format!("{what}: pulled {} ({})", pull.image, pull.amounts());
        return (vec![line], Some(10));
    }
    let tenth = pull.permille().map(|p| (p / 100).min(9)).unwrap_or(0);
    if reported.is_some_and(|r| r >= tenth) {
        return (Vec::new(), reported);
    }
    let percent = match pull.permille() {
        Some(p) => format!(" ({}%)", p / 10),
        None => String::new(),
    };
    let line = format!(
        "{what}: pulling {}: {}{percent}",
        pull.image,
        pull.amounts()
    );
    (vec![line], Some(tenth))
}

/// Where the progress of one wait goes: stderr, as a bar when it is a terminal.
pub struct Progress {
    terminal: bool,
    /// What was last drawn on the terminal's line (nothing is redrawn when it is the same).
    drawn: Option<String>,
    /// Per resource, the tenth of its pull last written as a plain line.
    reported: std::collections::HashMap<String, Option<u64>>,
}

impl Progress {
    /// Progress on stderr, drawn as a bar only when stderr is a terminal.
    pub fn on_stderr() -> Progress {
        Progress {
            terminal: std::io::stderr().is_terminal(),
            drawn: None,
            reported: Default::default(),
        }
    }

    /// Shows what resource `what` (as the server answered it: `item`) reports of its pull.
    pub fn show(&mut self, what: &str, item: &Value) {
        let Some(pull) = PullView::of(item) else {
            return;
        };
        // A pull that ended before this wait began is still said once, complete.
        let reported = self.reported.get(what).copied().flatten();
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let line = bar_line(what, &pull, terminal_columns());
            let ended = pull.finished && reported == Some(10);
            if !ended && self.drawn.as_deref() != Some(line.as_str()) {
                let _ = write!(err, "\r{line}\x1b[K");
                if pull.finished {
                    let _ = writeln!(err);
                }
                let _ = err.flush();
                self.drawn = (!pull.finished).then_some(line);
            }
            let now = if pull.finished { 10 } else { 0 };
            self.reported.insert(what.to_string(), Some(now));
        } else {
            let (lines, now) = plain_lines(what, &pull, reported);
            for line in lines {
                let _ = writeln!(err, "{line}");
            }
            self.reported.insert(what.to_string(), now);
        }
    }

    /// Ends a bar left on the terminal's line (the wait ends, one way or another).
    pub fn finish(&mut self) {
        if self.drawn.take().is_some() {
            let _ = writeln!(std::io::stderr().lock());
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The terminal's width: its window size, else `COLUMNS`, else 80.
fn terminal_columns() -> usize {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ only fills the winsize it is given, which lives for the whole call.
    let ok = unsafe { libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_col > 0 {
        return usize::from(size.ws_col);
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|c| *c > 0)
        .unwrap_or(80)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pulling(done: u64, total: u64) -> PullView {
        PullView {
            image: "127.0.0.1:5000/x:1".into(),
            done,
            total,
            finished: false,
        }
    }

    #[test]
    fn a_sandbox_waiting_for_a_pull_is_read_from_its_status() {
        let item = json!({
            "spec": {"image": "reg/x:1"},
            "status": {
                "phase": "Pending",
                "imagePull": {"bytesDone": 5, "bytesTotal": 10},
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "PullingImage"},
                    {"type": "ImagePulled", "status": "False", "reason": "Pulling"},
                ],
            },
        });
        let pull = PullView::of(&item).unwrap();
        assert_eq!((pull.done, pull.total, pull.finished), (5, 10, false));
        assert_eq!(pull.image, "reg/x:1");
        let mut done = item.clone();
        done["status"]["conditions"][1]["status"] = "True".into();
        assert!(PullView::of(&done).unwrap().finished);
        // No pull, no progress: a sandbox whose image was there, a snapshot.
        assert_eq!(PullView::of(&json!({"status": {"phase": "Running"}})), None);
        assert_eq!(PullView::of(&json!({"spec": {"sandbox": "a"}})), None);
    }

    #[test]
    fn the_bar_fills_with_the_bytes_and_fits_the_terminal() {
        let mib = 1024 * 1024;
        let half = bar_line("sandbox/demo", &pulling(12 * mib, 24 * mib), 100);
        assert!(half.chars().count() <= 100, "{half}");
        assert!(
            half.starts_with("sandbox/demo  pulling 127.0.0.1:5000/x:1  ["),
            "{half}"
        );
        assert!(half.ends_with("]  12.0MiB of 24.0MiB   50%"), "{half}");
        let inside = &half[half.find('[').unwrap() + 1..half.find(']').unwrap()];
        assert_eq!(inside.matches('#').count(), inside.len() / 2, "{half}");

        let empty = bar_line("sandbox/demo", &pulling(0, 0), 100);
        assert!(empty.contains("[-"), "{empty}");
        assert!(empty.ends_with("0B so far    ?%"), "{empty}");

        let mut finished = pulling(24 * mib, 24 * mib);
        finished.finished = true;
        let full = bar_line("sandbox/demo", &finished, 100);
        assert!(full.contains("pulled 127.0.0.1:5000/x:1"), "{full}");
        assert!(!full.contains('-'), "{full}");
        assert!(full.ends_with("24.0MiB  100%"), "{full}");

        // More bytes than announced (layers announced late) never overflow the bar.
        let over = bar_line("s", &pulling(30, 20), 80);
        assert!(over.contains("100%"), "{over}");

        // A narrow terminal gets the figures, cut to its width.
        let narrow = bar_line("sandbox/demo", &pulling(1, 2), 30);
        assert_eq!(narrow.chars().count(), 30, "{narrow}");
        assert!(!narrow.contains('['), "{narrow}");
    }

    #[test]
    fn plain_output_is_a_line_per_tenth_and_one_when_done() {
        let mut reported = None;
        let mut all = Vec::new();
        for done in [0, 3, 5, 9, 10, 55, 56, 99, 100] {
            let (lines, now) = plain_lines("sandbox/a", &pulling(done, 100), reported);
            all.extend(lines);
            reported = now;
        }
        assert_eq!(
            all,
            [
                "sandbox/a: pulling 127.0.0.1:5000/x:1: 0B of 100B (0%)",
                "sandbox/a: pulling 127.0.0.1:5000/x:1: 10B of 100B (10%)",
                "sandbox/a: pulling 127.0.0.1:5000/x:1: 55B of 100B (55%)",
                "sandbox/a: pulling 127.0.0.1:5000/x:1: 99B of 100B (99%)",
            ]
        );
        let mut done = pulling(100, 100);
        done.finished = true;
        let (lines, now) = plain_lines("sandbox/a", &done, reported);
        assert_eq!(lines, ["sandbox/a: pulled 127.0.0.1:5000/x:1 (100B)"]);
        let (again, _) = plain_lines("sandbox/a", &done, now);
        assert!(again.is_empty(), "the end is said once");
        // A size not known yet is said as bytes so far.
        let (lines, _) = plain_lines("sandbox/b", &pulling(2048, 0), None);
        assert_eq!(
            lines,
            ["sandbox/b: pulling 127.0.0.1:5000/x:1: 2.0KiB so far"]
        );
    }
}
