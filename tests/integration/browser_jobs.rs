//! The run and compare pages in headless Chromium against the real server: several files
//! dropped at once become one run and land on its page; the OOM rank is marked; ranks sort;
//! 64 ranks draw as small multiples; a comparison names both verdicts and what changed.

use fantoccini::Locator;
use serde_json::Value;

use crate::browser::{browser, driver, js, runtime, wait_for, wait_ready};
use crate::util::*;

/// Several files at once make one run and land on its page; a rank's page deletes it.
#[test]
fn several_files_dropped_together_are_one_run_and_land_on_its_page() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    // Named as launchers name them: the ranks come from the names, not the order.
    let mut paths = Vec::new();
    for (rank, name) in [(1, "ranks3_rank1"), (0, "ranks3_rank0")] {
        let from = fixtures().join("categories").join(format!("{name}.pickle.zst"));
        let to = dir.path().join(format!("job_rank{rank}.pickle.zst"));
        std::fs::copy(from, &to).unwrap();
        paths.push(to.to_str().unwrap().to_string());
    }
    runtime().block_on(async {
        let c = browser(&d).await;
        c.goto(&server.url("/")).await.unwrap();
        let input = c.find(Locator::Css("#files")).await.unwrap();
        input.send_keys(&paths.join("\n")).await.unwrap();
        wait_for(&c, "return location.pathname.startsWith('/r/')").await;
        wait_for(&c, "return document.getElementById('run').dataset.ready === 'true'").await;
        let rows = js(&c, "return [...document.querySelectorAll('#ranks tr')].map(r => [r.dataset.rank, r.classList.contains('oom'), r.textContent])").await;
        let rows = rows.as_array().unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0][0], "0");
        assert_eq!(rows[1][0], "1", "job_rank1 is rank 1");
        assert_eq!(rows[1][1], true, "rank 1 ran out of memory: its row is marked");
        assert_eq!(rows[0][1], false);
        // What fills memory: rank 1's bar, mostly activations at its OOM (truth: the category test).
        let fills = js(&c, "return [document.querySelectorAll('#ranks tr[data-rank=\"1\"] .stack span').length, document.querySelector('#ranks tr[data-rank=\"1\"] .fills').textContent]").await;
        assert!(fills[0].as_u64().unwrap() >= 2, "{fills}");
        assert!(fills[1].as_str().unwrap().contains("mostly activation"), "{fills}");
        let head = js(&c, "return document.getElementById('run-summary').textContent").await;
        assert!(head.as_str().unwrap().contains("Rank 1 ran out of memory: capacity"), "{head}");
        assert!(!head.as_str().unwrap().contains("OOM: "), "the headline says it once: {head}");
        // Why rank 1: against rank 0 (the only other), batches twice as large (the generator's).
        let why = js(&c, "const w = document.getElementById('why'); return [w.hidden, w.textContent, w.querySelector('a').getAttribute('href')]").await;
        assert_eq!(why[0], false, "{why}");
        let text = why[1].as_str().unwrap();
        assert!(text.contains("Why rank 1") && text.contains("more activation") && text.contains("2.0x"), "{text}");
        assert!(why[2].as_str().unwrap().starts_with("/compare/"), "{why}");
        // The run page's legend keys are its bars' colours, not the snapshot page's.
        let keys = js(&c, "return [...document.querySelectorAll('.legend i[class^=\"k-run\"]')].map(i => getComputedStyle(i).backgroundColor)").await;
        let bars = js(&c, "return ['.bar.reserved', '.bar.allocated'].map(s => getComputedStyle(document.querySelector(s)).backgroundColor)").await;
        assert_eq!(keys, bars, "legend {keys} against bars {bars}");
        // The overlaid curves have a legend naming each rank, the healthy one not in red, and
        // hovering a curve names its rank.
        let legend = js(&c, "return [...document.querySelectorAll('#curves-legend span')].map(s => [s.textContent, getComputedStyle(s.querySelector('i')).backgroundColor])").await;
        assert_eq!(legend[0][0], "rank 0", "{legend}");
        assert_eq!(legend[1][0], "rank 1 (OOM)", "{legend}");
        let healthy = legend[0][1].as_str().unwrap().to_string();
        let rgb: Vec<f64> = healthy
            .trim_start_matches(|c: char| !c.is_ascii_digit())
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|x| !x.is_empty())
            .take(3)
            .map(|x| x.parse().unwrap())
            .collect();
        assert!(!(rgb[0] > rgb[1] + 40.0 && rgb[0] > rgb[2] + 40.0), "a healthy rank drawn red: {healthy}");
        let title = js(&c, "const cv = document.getElementById('curves'); const b = cv.getBoundingClientRect(); cv.dispatchEvent(new MouseEvent('mousemove', {clientX: b.left + b.width / 2, clientY: b.top + b.height / 2, bubbles: true})); return cv.title").await;
        assert!(title.as_str().unwrap().starts_with("rank "), "{title}");
        // The compare link: by step, rank 1's four steps under rank 0's twelve (truth:
        // steps_survived), the different lengths said beside the totals.
        let run_url = c.current_url().await.unwrap().to_string();
        c.goto(&server.url(why[2].as_str().unwrap())).await.unwrap();
        wait_for(&c, "return document.getElementById('compare').dataset.ready === 'true'").await;
        let axis = js(&c, "return [document.getElementById('compare').dataset.axis, document.getElementById('overlay-hint').textContent, document.querySelector('.steps-note').textContent]").await;
        assert_eq!(axis[0], "steps=12", "{axis}");
        assert!(axis[1].as_str().unwrap().starts_with("x: steps"), "{axis}");
        assert!(axis[2].as_str().unwrap().contains("b died in step 4"), "{axis}");
        c.goto(&run_url).await.unwrap();
        wait_for(&c, "return document.getElementById('run').dataset.ready === 'true'").await;
        // A click on a row opens its rank's page, which can delete it.
        c.execute("document.querySelector('#ranks tr[data-rank=\"1\"] td').click()", vec![]).await.unwrap();
        wait_for(&c, "return location.pathname.startsWith('/s/')").await;
        wait_ready(&c).await;
        let page = c.current_url().await.unwrap().path().to_string();
        assert!(js(&c, "return !!document.querySelector('a[href^=\"/r/\"]')").await.as_bool().unwrap(), "links its run");
        c.execute("window.confirm = () => true; document.getElementById('delete').click();", vec![]).await.unwrap();
        wait_for(&c, "return location.pathname === '/'").await;
        assert_eq!(server.get(&page).status(), 404, "the link is gone");
        c.close().await.unwrap();
    });
}

/// 64 ranks (one small snapshot uploaded as each): rows sort by peak, curves are small multiples.
#[test]
fn a_run_of_64_ranks_sorts_and_draws_small_multiples() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let client = TestServer::client();
    let names = ["seed_frag_default", "seed_frag_expandable", "capacity_oom", "seed_frag_buffer"];
    let mut run = String::new();
    for rank in 0..64 {
        let body = std::fs::read(snapshot_path(names[rank % names.len()])).unwrap();
        let r =
            client.post(server.url(&format!("/api/v1/snapshots?run=big-job&rank={rank}"))).body(body).send().unwrap();
        assert_eq!(r.status().as_u16(), 202);
        run = r.json::<Value>().unwrap()["run"]["id"].as_str().unwrap().to_string();
    }
    let view = server.get_json(&format!("/api/v1/runs/{run}"));
    assert_eq!(view["summary"]["ranks"], 64);
    runtime().block_on(async {
        let c = browser(&d).await;
        c.goto(&server.url(&format!("/r/{run}"))).await.unwrap();
        wait_for(&c, "return document.getElementById('run').dataset.ready === 'true'").await;
        assert_eq!(js(&c, "return document.querySelectorAll('#ranks tr').length").await, 64);
        c.execute("document.querySelector('input[value=peak]').click()", vec![]).await.unwrap();
        let peaks = js(&c, "return [...document.querySelectorAll('#ranks tr')].map(r => r.dataset.rank)").await;
        let view = server.get_json(&format!("/api/v1/runs/{run}"));
        let max = view["summary"]["peak_reserved_bytes"]["rank_of_max"].as_i64().unwrap();
        assert_eq!(peaks[0], max.to_string(), "the highest peak first");
        let height = js(&c, "return document.getElementById('curves').clientHeight").await.as_f64().unwrap();
        assert!(height > 400.0, "64 small charts, not one: {height}");
        let inked = js(&c, "const cv = document.getElementById('curves'); const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data; let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n").await;
        assert!(inked.as_u64().unwrap() > 10_000, "the curves were drawn: {inked}");
        c.close().await.unwrap();
    });
}

/// The natural pair: a run and the same run with expandable segments.
#[test]
fn the_compare_page_names_both_verdicts_and_the_changed_setting() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let a = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    let b = server.upload(&snapshot_path("seed_frag_expandable"))["id"].as_str().unwrap().to_string();
    server.wait_done(&a);
    server.wait_done(&b);
    runtime().block_on(async {
        let c = browser(&d).await;
        // From a's page: "compare with…" offers b.
        c.goto(&server.url(&format!("/s/{a}"))).await.unwrap();
        wait_ready(&c).await;
        c.execute(
            "const s = document.getElementById('compare-with'); s.value = arguments[0]; s.dispatchEvent(new Event('change'));",
            vec![Value::String(b.clone())],
        )
        .await
        .unwrap();
        wait_for(&c, "return location.pathname.startsWith('/compare/')").await;
        assert_eq!(c.current_url().await.unwrap().path(), format!("/compare/{a}/{b}"));
        wait_for(&c, "return document.getElementById('compare').dataset.ready === 'true'").await;
        let text = js(&c, "return document.getElementById('devices').textContent").await;
        let text = text.as_str().unwrap();
        assert!(text.contains("out of memory: fragmentation"), "{text}");
        assert!(text.contains("no OOM"), "{text}");
        assert!(text.contains("expandable_segments"), "{text}");
        let inked = js(&c, "const cv = document.getElementById('overlay'); const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data; let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n").await;
        assert!(inked.as_u64().unwrap() > 500, "both curves drawn: {inked}");
        c.close().await.unwrap();
    });
}
