//! A real headless Chromium driven over WebDriver (chromedriver, through `fantoccini`), for
//! the tests that look at a page as a person would: what the DOM shows, screenshots, and
//! the browser's own log (script errors, Content-Security-Policy violations).
//!
//! Each browser gets a fresh profile and every background feature that would reach the
//! network turned off (this machine has none). A missing binary fails the test with how to
//! install it, never skips it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

/// How long a page gets to show what a test waits for (a loaded 2-core machine).
pub const PATIENCE: Duration = Duration::from_secs(20);

fn find(env: &str, names: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return PathBuf::from(path);
    }
    let paths = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&paths) {
        for name in names {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "{} not found: install the Debian packages chromium and chromium-driver (tests/run.sh does), \
         or set {env} to the binary",
        names[0]
    );
}

pub struct Browser {
    pub client: Client,
    driver: Child,
    stopped: bool,
    _profile: tempfile::TempDir,
    /// The test's name: its screenshots are `<name>-<step>.png`.
    name: String,
    /// Chromium is heavy for a 2-core machine: a browser counts as a heavy test while it
    /// lives (see `super::heavy_turn`).
    _turn: super::Turn,
}

/// Starts chromedriver and a headless Chromium session for test `name`.
pub async fn launch(name: &str) -> Browser {
    let turn = super::heavy_turn().await;
    let chromium = find(
        "CHROMIUM",
        &["chromium", "chromium-browser", "google-chrome"],
    );
    let chromedriver = find("CHROMEDRIVER", &["chromedriver"]);
    let port = super::free_port();
    let mut command = Command::new(&chromedriver);
    command
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // Its own process group: dropping the browser ends chromedriver and the Chromium it
    // started together, even when a test fails halfway.
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let driver = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", chromedriver.display()));
    let profile = tempfile::tempdir().expect("a profile directory");
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": chromium,
            "args": [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--no-first-run",
                "--no-default-browser-check",
                "--window-size=1400,1100",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        },
        "goog:loggingPrefs": { "browser": "ALL" },
    });
    let capabilities = match capabilities {
        Value::Object(map) => map,
        _ => unreachable!(),
    };
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let client = loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match ClientBuilder::new(connector)
            .capabilities(capabilities.clone())
            .connect(&url)
            .await
        {
            Ok(client) => break client,
            Err(e) if started.elapsed() < PATIENCE => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no WebDriver session from {}: {e}", chromedriver.display()),
        }
    };
    Browser {
        client,
        driver,
        stopped: false,
        _profile: profile,
        name: name.to_owned(),
        _turn: turn,
    }
}

/// chromedriver's browser log (`POST /session/{id}/se/log`), which W3C WebDriver lacks.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (
            http::Method::POST,
            Some(json!({ "type": "browser" }).to_string()),
        )
    }
}

/// Where screenshots go: `target/console-screenshots/` (kept as CI artefacts).
pub fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("console-screenshots");
    std::fs::create_dir_all(&dir).expect("create the screenshot directory");
    dir
}

impl Browser {
    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// Saves what the page shows now as `<test>-<step>.png`.
    pub async fn screenshot(&self, step: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("a screenshot");
        let path = screenshot_dir().join(format!("{}-{step}.png", self.name));
        std::fs::write(&path, png).expect("write the screenshot");
        path
    }

    /// The texts of the elements matching `css`, now.
    pub async fn texts(&self, css: &str) -> Vec<String> {
        let Ok(elements) = self.client.find_all(Locator::Css(css)).await else {
            return Vec::new();
        };
        let mut texts = Vec::new();
        for element in elements {
            if let Ok(text) = element.text().await {
                texts.push(text);
            }
        }
        texts
    }

    /// Waits until some element matching `css` has a text that `wanted` accepts, and returns
    /// that text; fails (with a screenshot) after [`PATIENCE`].
    pub async fn until_text(&self, css: &str, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let texts = self.texts(css).await;
            if let Some(found) = texts.iter().find(|t| wanted(t)) {
                return found.clone();
            }
            if started.elapsed() > PATIENCE {
                let shot = self.screenshot("timeout").await;
                panic!(
                    "the page never showed {what} in `{css}` (it shows {texts:?}; screenshot {})",
                    shot.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Clicks the element matching `css`, found again if the page redrew it between the find
    /// and the click (a stale element: the console refreshes its tables every few seconds, and
    /// on a busy machine that window is wide).
    pub async fn click(&self, css: &str) {
        let started = Instant::now();
        loop {
            let clicked = self
                .client
                .find(Locator::Css(css))
                .await
                .unwrap_or_else(|e| panic!("no `{css}` to click: {e}"))
                .click()
                .await;
            match clicked {
                Ok(()) => return,
                Err(e)
                    if e.to_string().contains("stale element") && started.elapsed() < PATIENCE =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("click `{css}`: {e}"),
            }
        }
    }

    /// Moves the pointer to the middle of the element matching `css`, as a person pointing at
    /// it (retried while the page redraws the element between the find and the move).
    pub async fn hover(&self, css: &str) {
        use fantoccini::actions::{InputSource, MouseActions, PointerAction};
        let started = Instant::now();
        loop {
            let moved = match self.client.find(Locator::Css(css)).await {
                Ok(element) => {
                    let pointer =
                        MouseActions::new("mouse".into()).then(PointerAction::MoveToElement {
                            element,
                            duration: None,
                            x: 0.0,
                            y: 0.0,
                        });
                    self.client
                        .perform_actions(pointer)
                        .await
                        .map_err(|e| e.to_string())
                }
                Err(e) => Err(e.to_string()),
            };
            match moved {
                Ok(()) => return,
                Err(e) if started.elapsed() > PATIENCE => panic!("cannot point at `{css}`: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Chooses the option of value `value` in the `<select>` matching `css`.
    pub async fn select(&self, css: &str, value: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no `{css}` to choose in: {e}"))
            .select_by_value(value)
            .await
            .unwrap_or_else(|e| panic!("choose {value:?} in `{css}`: {e}"));
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self
            .client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no `{css}` to type into: {e}"));
        element.clear().await.expect("clear the field");
        element.send_keys(text).await.expect("type");
    }

    /// The browser log's entries since the last call: (level, message).
    pub async fn log(&self) -> Vec<(String, String)> {
        let entries = self
            .client
            .issue_cmd(BrowserLog)
            .await
            .expect("the browser log");
        entries
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["level"].as_str().unwrap_or_default().to_owned(),
                    e["message"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// The log's errors (level SEVERE) since the last look.
    pub async fn errors(&self) -> Vec<String> {
        self.log()
            .await
            .into_iter()
            .filter(|(level, _)| level == "SEVERE")
            .map(|(_, message)| message)
            .collect()
    }

    pub async fn close(mut self) {
        let client = self.client.clone();
        let _ = client.close().await;
        self.stop();
    }

    fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        // The group started with chromedriver: it and the Chromium it launched.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.driver.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.stop();
    }
}
