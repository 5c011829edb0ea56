//! `cargo bench --bench browser`: the share page of the real 243 MiB big_trace snapshot in
//! headless Chromium (Debian's, through ChromeDriver). Prints the time from navigation until the
//! map and timeline are drawn, and how long moving the cursor takes to redraw the map, as the
//! page itself measures them (`performance.now()`). Asserts nothing: machines are noisy.

#[path = "common.rs"]
mod common;

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{ClientBuilder, Locator};
use serde_json::{Value, json};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let Some(snapshot) = common::big_trace() else {
        println!("big_trace.pickle.xz not found beside the checkout; set FRAGSCOPE_BIG_TRACE to a snapshot");
        return;
    };
    println!("{}", common::machine());
    if !std::path::Path::new("/usr/bin/chromedriver").exists() {
        println!("Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let mut server = Command::new(env!("CARGO_BIN_EXE_fragscope"))
        .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
        .arg(data.path().join("data"))
        .env("FRAGSCOPE_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let base = line.trim().rsplit(' ').next().unwrap().to_string();
    let http = reqwest::blocking::Client::builder().timeout(Duration::from_secs(600)).build().unwrap();
    let t = Instant::now();
    let file = std::fs::File::open(&snapshot).unwrap();
    let created: Value = http
        .post(format!("{base}/api/v1/snapshots"))
        .body(reqwest::blocking::Body::new(file))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let upload_s = t.elapsed().as_secs_f64();
    let id = created["id"].as_str().unwrap().to_string();
    common::wait_ready(&http, &base, &id, Duration::from_millis(50));
    let stored_s = t.elapsed().as_secs_f64();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut driver = Command::new("/usr/bin/chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // ChromeDriver listens once it has started: a fixed wait was too short on a busy machine.
    let listening = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(listening.elapsed() < Duration::from_secs(30), "chromedriver did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let profile = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut settled = (Duration::ZERO, false);
    let (ready, draws) = rt.block_on(async {
        let args = vec![
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--no-first-run".into(),
            "--window-size=1280,1100".into(),
            format!("--user-data-dir={}", profile.path().display()),
        ];
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), json!({"binary": "/usr/bin/chromium", "args": args}));
        let c = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap();
        let wait = |c: &fantoccini::Client| {
            let c = c.clone();
            async move {
                for _ in 0..600 {
                    if c.execute("return document.body.dataset.ready === '1'", vec![]).await.unwrap() == json!(true) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("the page never became ready");
            }
        };
        // The first load with the browser's cache empty, then three loads with it warm. A blank
        // page between: a URL that differs only by its fragment would not load the page again.
        let mut ready = Vec::new();
        for i in 0..4 {
            c.goto("about:blank").await.unwrap();
            if i == 0 {
                settled = settle().await;
            }
            c.goto(&format!("{base}/s/{id}#e={}", 2_999_999 - i)).await.unwrap();
            wait(&c).await;
            let ms: f64 = c.execute("return Number(document.body.dataset.readyMs)", vec![]).await.unwrap().as_f64().unwrap();
            ready.push(ms);
        }
        // The cursor: arrow keys, then jumps across the whole trace as a drag makes them.
        let timeline = c.find(Locator::Css("#timeline")).await.unwrap();
        let mut draws = Vec::new();
        for k in 0..30 {
            let before = c.execute("return document.getElementById('segmap').dataset.layout", vec![]).await.unwrap();
            if k % 2 == 0 {
                timeline.send_keys("\u{E012}").await.unwrap();
            } else {
                c.execute(
                    "const t = document.getElementById('timeline'); const r = t.getBoundingClientRect(); const x = r.left + 70 + (r.width - 80) * arguments[0]; t.dispatchEvent(new MouseEvent('mousedown', {clientX: x, clientY: r.top + 50, bubbles: true})); t.dispatchEvent(new MouseEvent('mouseup', {clientX: x, clientY: r.top + 50, bubbles: true}));",
                    vec![json!((k as f64 * 0.37) % 1.0)],
                )
                .await
                .unwrap();
            }
            for _ in 0..500 {
                let now = c.execute("return document.getElementById('segmap').dataset.layout", vec![]).await.unwrap();
                if now != before {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let ms = c.execute("return Number(document.getElementById('segmap').dataset.drawMs || 'NaN')", vec![]).await.unwrap();
            if let Some(ms) = ms.as_f64() {
                draws.push(ms);
            }
        }
        c.close().await.unwrap();
        (ready, draws)
    });
    for child in [&mut driver, &mut server] {
        let _ = child.kill();
        let _ = child.wait();
    }
    println!(
        "snapshot: {} (3,000,000 events); upload {upload_s:.1} s, analysed and stored {stored_s:.1} s after it began\n",
        snapshot.display()
    );
    let (waited, at_rest) = settled;
    let how = if at_rest { "once the machine was at rest" } else { "with the machine still busy (waited at most)" };
    println!(
        "the first load began {how}, {:.1} s after the browser had started (a user's browser is running when they \
         open a link; one that has just started still works on a 2-core machine)\n",
        waited.as_secs_f64()
    );
    println!("| step in headless Chromium | median | worst | target |");
    println!("|---|---|---|---|");
    let worst = |v: &Vec<f64>| v.iter().copied().fold(0.0, f64::max);
    let (first, warm) = (ready[0], ready[1..].to_vec());
    let met = |ms: f64| common::verdict(ms <= 300.0);
    println!(
        "| navigation to map and timeline drawn, first load (browser cache empty) | {first:.0} ms | | within 1500 ms; 300 ms (#33): {} |",
        met(first)
    );
    println!(
        "| navigation to map and timeline drawn ({} loads, browser cache warm) | {:.0} ms | {:.0} ms | within 1500 ms; 300 ms (#33): {} |",
        warm.len(),
        common::median(warm.clone()),
        worst(&warm),
        met(worst(&warm))
    );
    println!(
        "| cursor move to map redrawn ({} moves) | {:.1} ms | {:.1} ms | within 100 ms |",
        draws.len(),
        common::median(draws.clone()),
        worst(&draws)
    );
}

/// Waits until the machine is at rest: two tenths of a second in a row with its cores at least
/// 90% idle (`/proc/stat`), at most 5 s. A Chromium that has just started still sets itself up
/// for a while after its first blank page, and on two cores that work ran beside the page's
/// first load (Selenium, eight first loads of each alternated: 239-368 ms, median 322, at
/// once; 221-325 ms, median 275, 0.6 s later; the fresh EPYC VM is at rest 0.2-0.4 s after the
/// blank page). Returns how long it waited, and whether the machine came to rest.
async fn settle() -> (Duration, bool) {
    fn idle_and_total() -> Option<(u64, u64)> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let cpu: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
        Some((cpu.get(3)? + cpu.get(4)?, cpu.iter().sum()))
    }
    let began = Instant::now();
    let mut quiet = 0;
    while quiet < 2 && began.elapsed() < Duration::from_secs(5) {
        let Some((idle0, total0)) = idle_and_total() else { break };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some((idle1, total1)) = idle_and_total() else { break };
        let share = idle1.saturating_sub(idle0) as f64 / total1.saturating_sub(total0).max(1) as f64;
        quiet = if share >= 0.9 { quiet + 1 } else { 0 };
    }
    (began.elapsed(), quiet >= 2)
}
