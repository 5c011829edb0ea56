//! Every kind of page a user meets, at 1500 and 1000 px wide, in headless Chromium: a capacity
//! OOM, a leak, an inference OOM, a healthy run, a run of four ranks and a comparison. Nothing
//! may be wider than the window, and each page is kept as a full-length screenshot in
//! `target/screenshots/tour-*` for people to read.

use std::time::Duration;

use fantoccini::Client;
use serde_json::Value;

use crate::browser::{browser, driver, js, runtime, screenshot, wait_for, wait_ready};
use crate::util::*;

/// Checks the open page at `width` and keeps its screenshot, the whole length of it.
async fn look(c: &Client, name: &str, width: u32) {
    c.set_window_size(width, 1000).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let over = js(c, "return [document.documentElement.scrollWidth, window.innerWidth]").await;
    let (scroll, inner) = (over[0].as_u64().unwrap(), over[1].as_u64().unwrap());
    assert!(scroll <= inner, "{name} at {width} px: the page is {scroll} px wide in a {inner} px window");
    // Anything cut off inside its own box (a label, a table cell) scrolls sideways or hides.
    let cut = js(
        c,
        "return [...document.querySelectorAll('main *')].filter(e => e.offsetParent && getComputedStyle(e).overflowX !== 'visible' && e.scrollWidth > e.clientWidth + 1 && e.tagName !== 'CANVAS').map(e => e.tagName + '.' + e.className + ': ' + e.textContent.slice(0, 60))",
    )
    .await;
    assert_eq!(cut, Value::Array(vec![]), "{name} at {width} px: boxes cut their content");
    let height = js(c, "return document.documentElement.scrollHeight").await.as_u64().unwrap().min(8000) as u32;
    c.set_window_size(width, height + 100).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    screenshot(c, &format!("tour-{name}-{width}")).await;
}

fn job(name: &str) -> std::path::PathBuf {
    fixtures().join("jobs").join(format!("{name}.pickle.zst"))
}

#[test]
fn every_kind_of_page_fits_1500_and_1000_px() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let snapshots = [
        ("capacity", job("ladder_b24_oom")),
        ("leak", job("leak_retained_graph")),
        ("inference", job("infer_kv_oom")),
        ("healthy", job("healthy_shapes")),
    ];
    let mut ids = Vec::new();
    for (name, path) in &snapshots {
        let id = server.upload(path)["id"].as_str().unwrap().to_string();
        assert_eq!(server.wait_done(&id)["status"], "ready", "{name}");
        ids.push((*name, id));
    }
    // Steps are counted from 1, and an inference trace's are forward passes, not training steps.
    let page = |i: usize| server.get(&format!("/s/{}", ids[i].1)).text().unwrap();
    assert!(page(2).contains(" forward passes (steps without a backward) found"), "inference");
    assert!(!page(2).contains("training steps"), "inference");
    // The leak's highest step is its last, counted from 1: "14 training steps found; ... in step 14".
    let leak = page(1);
    let n = leak
        .split(" training steps found")
        .next()
        .unwrap()
        .rsplit(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .to_string();
    assert!(leak.contains(&format!(" in step {n} during")), "{n}");
    // Four ranks: ranks3's three, and rank 0's file again as rank 3.
    let mut run = String::new();
    for (rank, file) in [(0, 0), (1, 1), (2, 2), (3, 0)] {
        let body = std::fs::read(fixtures().join(format!("categories/ranks3_rank{file}.pickle.zst"))).unwrap();
        let r = TestServer::client()
            .post(server.url(&format!("/api/v1/snapshots?run=tour&rank={rank}")))
            .body(body)
            .send()
            .unwrap();
        let v: Value = r.json().unwrap();
        run = v["run"]["page_url"].as_str().unwrap().to_string();
        server.wait_done(v["id"].as_str().unwrap());
    }
    runtime().block_on(async {
        let c = browser(&d).await;
        for (name, id) in &ids {
            c.goto(&server.url(&format!("/s/{id}"))).await.unwrap();
            wait_ready(&c).await;
            for width in [1500, 1000] {
                look(&c, name, width).await;
            }
        }
        c.goto(&server.url(&run)).await.unwrap();
        wait_for(&c, "return document.getElementById('run').dataset.ready === 'true'").await;
        for width in [1500, 1000] {
            look(&c, "run4", width).await;
        }
        let (a, b) = (&ids[3].1, &ids[0].1);
        c.goto(&server.url(&format!("/compare/{a}/{b}"))).await.unwrap();
        wait_for(&c, "return document.getElementById('compare').dataset.ready === 'true'").await;
        for width in [1500, 1000] {
            look(&c, "compare", width).await;
        }
        c.close().await.unwrap();
    });
}
