//! The snapshot page's rough edges, in headless Chromium: what fills memory takes the page's
//! width, the timeline's legend is the chart's colours, and a fragment edited on the open page
//! applies.

use std::time::Duration;

use serde_json::json;

use crate::browser::{browser, driver, js, runtime, wait_for, wait_ready};
use crate::util::*;

#[test]
fn what_fills_memory_is_full_width_the_legend_matches_the_chart_and_an_edited_fragment_applies() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let id = server.upload(&fixtures().join("categories/ranks3_rank1.pickle.zst"))["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&id)["status"], "ready");
    runtime().block_on(async {
        let c = browser(&d).await;
        c.goto(&server.url(&format!("/s/{id}"))).await.unwrap();
        wait_ready(&c).await;
        // `.fills` of the run page's column once squeezed this section to 22%.
        let widths = js(&c, "const s = document.querySelector('section.fills'); return [s.getBoundingClientRect().width, s.parentElement.getBoundingClientRect().width]").await;
        let (w, parent) = (widths[0].as_f64().unwrap(), widths[1].as_f64().unwrap());
        assert!(w >= 0.9 * parent, "what fills memory is {w} px of {parent}");
        // The timeline draws reserved pale and allocated blue (draw/timeline.js): so does its legend.
        let legend = js(&c, "return ['.legend.hint .k-reserved', '.legend.hint .k-allocated'].map(s => getComputedStyle(document.querySelector(s)).backgroundColor)").await;
        assert_eq!(legend, json!(["rgb(213, 222, 234)", "rgb(47, 111, 196)"]));
        // A fragment typed into the open page's address applies, as a cold link does.
        c.execute("location.hash = '#e=2'", vec![]).await.unwrap();
        let mut label = json!(null);
        for _ in 0..200 {
            label = js(&c, "return document.getElementById('event-label').textContent").await;
            if label.as_str().unwrap_or("").starts_with("After event 2 ") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(label.as_str().unwrap().starts_with("After event 2 "), "{label}");
        // The cursor's label gives the value at the event (the map's totals), not the maximum
        // of the pixel's bucket; the pixel's range is said apart.
        let mut cursor = json!(null);
        for _ in 0..100 {
            cursor = js(&c, "return document.getElementById('timeline').dataset.cursorLabel || null").await;
            if cursor.as_str().is_some_and(|l| l.starts_with("2: reserved ")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let cursor = cursor.as_str().unwrap_or_default().to_string();
        assert!(cursor.starts_with("2: reserved ") && cursor.contains("(this pixel: allocated"), "{cursor}");
        c.close().await.unwrap();
    });
}

/// Two runs of different lengths (rank 0 ran its steps, rank 1 died early): the compare page
/// says so beside the totals, compares the step peaks both reached, and heads the category rows.
#[test]
fn a_comparison_of_runs_of_different_lengths_says_so() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let ids: Vec<String> = ["ranks3_rank0", "ranks3_rank1"]
        .iter()
        .map(|n| {
            let id = server.upload(&fixtures().join(format!("categories/{n}.pickle.zst")))["id"]
                .as_str()
                .unwrap()
                .to_string();
            assert_eq!(server.wait_done(&id)["status"], "ready");
            id
        })
        .collect();
    let api = server.get_json(&format!("/api/v1/compare?a={}&b={}", ids[0], ids[1]));
    let dev = &api["devices"][0];
    let (sa, sb) = (dev["steps"]["a"].as_u64().unwrap(), dev["steps"]["b"].as_u64().unwrap());
    assert!(sa > sb && sb > 0, "{}", dev["steps"]);
    runtime().block_on(async {
        let c = browser(&d).await;
        c.goto(&server.url(&format!("/compare/{}/{}", ids[0], ids[1]))).await.unwrap();
        let mut note = json!(null);
        for _ in 0..200 {
            note = js(&c, "const n = document.querySelector('.steps-note'); return n && n.textContent").await;
            if note.is_string() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let note = note.as_str().expect("no note on runs of different lengths").to_string();
        assert!(note.contains(&format!("ran {sa} steps")) && note.contains(&format!("died in step {sb}")), "{note}");
        let rows = js(&c, "return [...document.querySelectorAll('tr.heading, tr')].map(r => r.textContent)").await;
        let rows: Vec<String> = rows.as_array().unwrap().iter().map(|r| r.as_str().unwrap().to_string()).collect();
        assert!(rows.iter().any(|r| r.starts_with(&format!("highest step peak, first {sb} steps"))), "{rows:?}");
        assert!(rows.iter().any(|r| r.starts_with("What fills memory, by category")), "{rows:?}");
        c.close().await.unwrap();
    });
}

/// The call sites that hold the most are told apart: each takes its own colour from one
/// palette, in the chart's legend and the map alike (lines 334, 336 and 338 of one function
/// and the model's line 32 once came out as two greens from a hash).
#[test]
fn the_sites_that_hold_the_most_have_colours_told_apart() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let id = server.upload(&fixtures().join("jobs/leak_retained_graph.pickle.zst"))["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&id)["status"], "ready");
    runtime().block_on(async {
        let c = browser(&d).await;
        c.goto(&server.url(&format!("/s/{id}"))).await.unwrap();
        wait_ready(&c).await;
        let mut legend = json!(null);
        for _ in 0..200 {
            legend = js(&c, "return [...document.querySelectorAll('#active-legend li')].filter(li => !li.textContent.startsWith('other')).map(li => [li.textContent, getComputedStyle(li.querySelector('i')).backgroundColor])").await;
            let named = legend.as_array().map(|l| l.iter().filter(|x| x[0].as_str().unwrap().contains(":33")).count()).unwrap_or(0);
            let first = legend[0][1].as_str().unwrap_or("");
            if named >= 3 && !first.contains("hsl") && first.starts_with("rgb(") && !first.contains(", 30%") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let rows = legend.as_array().unwrap();
        let colours: Vec<&str> = rows.iter().map(|r| r[1].as_str().unwrap()).collect();
        let distinct: std::collections::BTreeSet<&&str> = colours.iter().collect();
        assert_eq!(distinct.len(), colours.len(), "every series its own colour: {legend}");
        // Each named site takes a colour of the palette (distinct hues and shades, chosen to
        // be told apart), not a hash's neighbour of another's.
        let palette = c
            .execute_async(
                "const done = arguments[arguments.length - 1]; import('/static/js/data/colors.js').then((m) => { const el = document.createElement('i'); document.body.append(el); done(m.PALETTE.map((p) => { el.style.background = p; return getComputedStyle(el).backgroundColor; })); });",
                vec![],
            )
            .await
            .unwrap();
        let palette: Vec<&str> = palette.as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
        let named: Vec<&str> =
            rows.iter().filter(|r| r[0].as_str().unwrap().contains(".py:")).map(|r| r[1].as_str().unwrap()).collect();
        assert!(named.len() >= 5, "{legend}");
        assert!(named.iter().all(|c| palette.contains(c)), "{named:?} against the palette {palette:?}");
        c.close().await.unwrap();
    });
}

/// The icicle follows the cursor: drawn once the page rests, and a click on a frame zooms to
/// it (it fills the width; fewer nodes drawn), a second click zooms back out.
#[test]
fn the_icicle_draws_the_memory_at_the_cursor_and_zooms_on_a_click() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let id = server.upload(&fixtures().join("categories/ranks3_rank1.pickle.zst"))["id"].as_str().unwrap().to_string();
    assert_eq!(server.wait_done(&id)["status"], "ready");
    runtime().block_on(async {
        let c = browser(&d).await;
        c.goto(&server.url(&format!("/s/{id}"))).await.unwrap();
        wait_ready(&c).await;
        let drawn = "const n = Number(document.getElementById('flame').dataset.nodes || 0); return n > 2 && n";
        let nodes = wait_for(&c, drawn).await.as_u64().unwrap();
        assert!(nodes > 2, "the icicle was drawn: {nodes} nodes");
        let event = js(&c, "return [document.getElementById('flame').dataset.event, document.getElementById('event-label').textContent]").await;
        assert!(event[1].as_str().unwrap().starts_with(&format!("After event {} ", event[0].as_str().unwrap())), "{event}");
        // Click the middle of the second row: that frame fills the width.
        let focus = js(&c, "const cv = document.getElementById('flame'); const b = cv.getBoundingClientRect(); cv.dispatchEvent(new MouseEvent('click', {clientX: b.left + 5, clientY: b.top + 18 + 9, bubbles: true})); return [cv.dataset.focus, Number(cv.dataset.nodes)]").await;
        assert!(!focus[0].as_str().unwrap().is_empty(), "zoomed to a frame: {focus}");
        assert!(focus[1].as_u64().unwrap() <= nodes, "{focus}");
        let out = js(&c, "const cv = document.getElementById('flame'); const b = cv.getBoundingClientRect(); cv.dispatchEvent(new MouseEvent('click', {clientX: b.left + 5, clientY: b.top + 18 + 9, bubbles: true})); return cv.dataset.focus").await;
        assert_eq!(out, json!(""), "a second click zooms back out");
        c.close().await.unwrap();
    });
}
