//! A real headless Chromium (Debian's `chromium` package, which .ci/run installs), driven over
//! its DevTools protocol on a WebSocket: navigate, evaluate script in the page, set a file
//! input's files, take screenshots. One browser per test, with a throwaway profile, stopped when
//! dropped. Nothing here fakes the browser: a missing Chromium fails the test.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::{stream::MaybeTlsStream, Message, WebSocket};

pub struct Browser {
    child: Child,
    socket: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    _profile: tempfile::TempDir,
}

/// Where Chromium is: Debian installs `/usr/bin/chromium`.
fn binary() -> &'static str {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|b| Path::new(b).exists())
        .expect(
            "Chromium (Debian's `chromium` package, which .ci/run installs) must be installed \
             for the dashboard tests",
        )
}

impl Browser {
    /// Starts Chromium with one blank page and attaches to that page.
    pub fn start() -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let mut child = Command::new(binary())
            .args([
                "--headless=new",
                // The test runs as root in a container, where Chromium's own sandbox cannot start.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--metrics-recording-only",
                "--window-size=1400,1000",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start chromium");
        // Chromium says where its DevTools endpoint listens on stderr.
        let stderr = child.stderr.take().unwrap();
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("DevTools listening on ") {
                    let _ = sender.send(url.trim().to_string());
                }
            }
        });
        let browser_url = receiver
            .recv_timeout(Duration::from_secs(60))
            .expect("chromium did not open its DevTools endpoint in 60 s");
        let authority = browser_url
            .strip_prefix("ws://")
            .and_then(|rest| rest.split('/').next())
            .unwrap()
            .to_string();
        let (_, list) = super::common::http(
            "GET",
            &format!("http://{authority}/json/list"),
            None,
            None,
            "",
        );
        let targets: Value = serde_json::from_str(&list).expect("DevTools target list");
        let page = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .expect("a page target")["webSocketDebuggerUrl"]
            .as_str()
            .unwrap()
            .to_string();
        let (socket, _) = tungstenite::connect(page.as_str()).expect("attach to the page");
        if let MaybeTlsStream::Plain(stream) = socket.get_ref() {
            stream
                .set_read_timeout(Some(Duration::from_secs(120)))
                .unwrap();
        }
        let mut browser = Browser {
            child,
            socket,
            next_id: 0,
            _profile: profile,
        };
        browser.call("Page.enable", json!({}));
        browser.call("Runtime.enable", json!({}));
        browser
    }

    /// Sends a DevTools command and returns its result, skipping the events that come between.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({"id": id, "method": method, "params": params}).to_string();
        self.socket.send(Message::text(message)).unwrap();
        loop {
            let reply = match self.socket.read().expect("DevTools connection") {
                Message::Text(text) => text,
                _ => continue,
            };
            let reply: Value = serde_json::from_str(reply.as_str()).unwrap();
            if reply["id"] == id {
                assert!(
                    reply.get("error").is_none(),
                    "{method} failed: {}",
                    reply["error"]
                );
                return reply["result"].clone();
            }
        }
    }

    pub fn navigate(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
        self.wait_for(
            "document.readyState === 'complete'",
            Duration::from_secs(30),
        );
    }

    /// The value of a JavaScript expression in the page (promises are awaited).
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "awaitPromise": true, "returnByValue": true}),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression} threw: {}",
            result["exceptionDetails"]
        );
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is truthy in the page.
    pub fn wait_for(&mut self, expression: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let result = self.call(
                "Runtime.evaluate",
                json!({"expression": format!("Boolean({expression})"), "returnByValue": true}),
            );
            if result["result"]["value"] == true {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting until {expression}; page text:\n{}",
                self.eval("document.body ? document.body.innerText : ''")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Gives the file input the page's `selector` finds these files, as if chosen by hand.
    pub fn set_files(&mut self, selector: &str, files: &[&Path]) {
        let found = self.call(
            "Runtime.evaluate",
            json!({"expression": format!("document.querySelector({selector:?})")}),
        );
        let object = found["result"]["objectId"]
            .as_str()
            .unwrap_or_else(|| panic!("no element {selector}"))
            .to_string();
        let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        self.call(
            "DOM.setFileInputFiles",
            json!({"files": files, "objectId": object}),
        );
    }

    /// A PNG of the page as it is drawn now.
    pub fn screenshot(&mut self) -> Vec<u8> {
        use base64::Engine as _;
        let shot = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        );
        base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
