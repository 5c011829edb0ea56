//! The page in a real browser: Debian's headless Chromium driven through ChromeDriver against
//! the real server. Screenshots land in target/screenshots for people to look at.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::actions::{InputSource, MouseActions, PointerAction};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::util::*;

const CHROMIUM: &str = "/usr/bin/chromium";
const DRIVER: &str = "/usr/bin/chromedriver";

/// ChromeDriver on a free port, killed when dropped.
pub(crate) struct Driver {
    child: Child,
    port: u16,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// None where Chromium is not installed (CI installs it: .ci/run); say so.
pub(crate) fn driver() -> Option<Driver> {
    if !std::path::Path::new(CHROMIUM).exists() || !std::path::Path::new(DRIVER).exists() {
        assert!(std::env::var("CI").is_err(), "CI must have chromium and chromium-driver");
        skipped("Debian's chromium and chromium-driver are not installed");
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child =
        Command::new(DRIVER).arg(format!("--port={port}")).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Driver { child, port, _profile: tempfile::tempdir().unwrap() })
}

pub(crate) async fn browser(d: &Driver) -> Client {
    let args = [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1280,1100",
        "--force-device-scale-factor=1",
    ];
    let mut args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    args.push(format!("--user-data-dir={}", d._profile.path().display()));
    let mut caps = serde_json::Map::new();
    caps.insert("goog:chromeOptions".into(), json!({"binary": CHROMIUM, "args": args}));
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", d.port))
        .await
        .expect("a browser session")
}

pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

pub(crate) async fn screenshot(c: &Client, name: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.png")), c.screenshot().await.unwrap()).unwrap();
}

/// Waits until `script` returns something other than null or false, and returns it.
pub(crate) async fn wait_for(c: &Client, script: &str) -> Value {
    for _ in 0..600 {
        let v = js(c, script).await;
        if v != Value::Null && v != Value::Bool(false) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never true: {script}");
}

/// Waits until the page has drawn its data (snapshot.js sets `data-ready`).
pub(crate) async fn wait_ready(c: &Client) {
    for _ in 0..200 {
        if c.execute("return document.body.dataset.ready === '1'", vec![]).await.unwrap() == json!(true) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the page never became ready");
}

pub(crate) async fn js(c: &Client, script: &str) -> Value {
    c.execute(script, vec![]).await.unwrap()
}

/// The segment map's geometry, as the page drew it.
async fn layout(c: &Client) -> Value {
    serde_json::from_str(js(c, "return document.getElementById('segmap').dataset.layout").await.as_str().unwrap())
        .unwrap()
}

async fn pixel(c: &Client, x: f64, y: f64) -> [u8; 3] {
    let v = c
        .execute(
            "const c = document.getElementById('segmap'); const d = c.getContext('2d').getImageData(arguments[0], arguments[1], 1, 1).data; return [d[0], d[1], d[2]];",
            vec![json!(x.round()), json!(y.round())],
        )
        .await
        .unwrap();
    let a: Vec<u8> = serde_json::from_value(v).unwrap();
    [a[0], a[1], a[2]]
}

fn saturated(p: [u8; 3]) -> bool {
    p.iter().max().unwrap() - p.iter().min().unwrap() > 40
}

#[test]
fn upload_in_the_browser_lands_on_the_page() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    runtime().block_on(async {
        let c = browser(&d).await;
        c.goto(&server.url("/")).await.unwrap();
        let input = c.find(Locator::Css("#files")).await.unwrap();
        input.send_keys(snapshot_path("seed_frag_default").to_str().unwrap()).await.unwrap();
        // A 4 KiB upload may finish and leave the home page before its progress bar is seen
        // (waiting for the bar made this test fail under load): wait for where it lands.
        for _ in 0..600 {
            if c.current_url().await.unwrap().path().starts_with("/s/") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(c.current_url().await.unwrap().path().starts_with("/s/"), "did not land on the snapshot page");
        wait_ready(&c).await;
        let verdict = c.find(Locator::Css(".verdict h2")).await.unwrap().text().await.unwrap();
        // The headline names the verdict, then what the step needs against the budget.
        assert!(verdict.starts_with("Out of memory: fragmentation: the step needs "), "{verdict}");
        screenshot(&c, "upload-landed").await;
        c.goto(&server.url("/")).await.unwrap();
        let recent = c.find(Locator::Css("table.recent td a")).await.unwrap().text().await.unwrap();
        assert_eq!(recent, "seed_frag_default.pickle");
        c.close().await.unwrap();
    });
}

#[test]
fn the_map_draws_the_pinned_gap_hover_shows_frames_the_cursor_moves_the_map_and_the_link_restores_the_view() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let id = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    let oom: Value = server.get_json(&format!("/api/v1/snapshots/{id}/ooms"));
    let at = oom[0]["ooms"][0]["event_index"].as_u64().unwrap();
    let m = server.get_json(&format!("/api/v1/snapshots/{id}/devices/0/state?event={at}"));
    runtime().block_on(async {
        let c = browser(&d).await;
        c.goto(&server.url(&format!("/s/{id}"))).await.unwrap();
        wait_ready(&c).await;
        let l = layout(&c).await;
        assert_eq!(l["event"], at, "the page opens at the OOM");
        screenshot(&c, "seed-at-oom").await;
        // Where the map data says the first row's pinned gap is, the canvas is hatched grey.
        let row0 = l["order"][0].as_str().unwrap();
        let seg = m["segments"].as_array().unwrap().iter().find(|s| s["address"] == row0).unwrap();
        let base = u64::from_str_radix(&row0[2..], 16).unwrap() as f64;
        let gap = seg["blocks"].as_array().unwrap().iter().find(|b| b["state"] == "inactive").unwrap();
        let live = seg["blocks"].as_array().unwrap().iter().find(|b| b["state"] == "active_allocated").unwrap();
        let (label, bpp, x0, top, bar) = (
            l["label"].as_f64().unwrap(),
            l["bpp"].as_f64().unwrap(),
            l["x0"].as_f64().unwrap(),
            l["top"].as_f64().unwrap(),
            l["bar"].as_f64().unwrap(),
        );
        let x_of = |b: &Value, frac: f64| {
            let off = u64::from_str_radix(&b["address"].as_str().unwrap()[2..], 16).unwrap() as f64 - base;
            label + (off + b["size"].as_f64().unwrap() * frac - x0) / bpp
        };
        let y = top + bar / 2.0;
        // Samples along the gap, then 12 neighbouring pixels in its middle (the hatch repeats
        // every 6 px, so they must cross a line).
        let mid = x_of(gap, 0.5);
        let xs = (1..20).map(|k| x_of(gap, k as f64 / 20.0)).chain((0..12).map(|k| mid + k as f64));
        let mut lines = 0;
        for x in xs {
            let p = pixel(&c, x, y).await;
            assert!(!saturated(p), "pinned gap pixel {p:?} at x {x} is coloured");
            if p[0] < 200 {
                lines += 1;
            }
        }
        assert!(lines >= 2, "no hatching drawn in the pinned gap");
        assert!(saturated(pixel(&c, x_of(live, 0.5), y).await), "the live block is not coloured");
        // Hover over the live block: the tooltip names its frames.
        js(&c, "document.getElementById('segmap').scrollIntoView({block: 'center'})").await;
        let canvas = c.find(Locator::Css("#segmap")).await.unwrap();
        let (w, h) = (
            js(&c, "return document.getElementById('segmap').clientWidth").await.as_f64().unwrap(),
            js(&c, "return document.getElementById('segmap').clientHeight").await.as_f64().unwrap(),
        );
        let mouse = MouseActions::new("mouse".into()).then(PointerAction::MoveToElement {
            element: canvas.clone(),
            x: (x_of(live, 0.5) - w / 2.0).round(),
            y: (y - h / 2.0).round(),
            duration: None,
        });
        c.perform_actions(mouse).await.unwrap();
        let text = js(&c, "const t = document.getElementById('tooltip'); return t.hidden ? '' : t.textContent")
            .await
            .as_str()
            .unwrap()
            .to_string();
        assert!(text.contains("active_allocated") && text.contains("big_small_step"), "tooltip: {text}");
        assert!(text.contains("holds: "), "the tooltip names what the block holds: {text}");
        // Every row's label fits its column ("0x7f... 1000.00 Mi" was cut).
        assert_eq!(js(&c, "return document.getElementById('segmap').dataset.labelsCut").await, json!("0"));
        screenshot(&c, "seed-hover").await;
        // The arrow key moves the cursor, and the map follows.
        let tl = c.find(Locator::Css("#timeline")).await.unwrap();
        tl.send_keys("\u{E012}").await.unwrap();
        for _ in 0..100 {
            if layout(&c).await["event"] == at - 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        assert_eq!(layout(&c).await["event"], at - 1);
        assert!(c.current_url().await.unwrap().fragment().unwrap().contains(&format!("e={}", at - 1)));
        // A link with a view in its fragment reopens that view.
        c.goto(&server.url(&format!("/s/{id}#d=0&e=12&sort=size"))).await.unwrap();
        c.refresh().await.unwrap();
        wait_ready(&c).await;
        assert_eq!(layout(&c).await["event"], 12);
        assert_eq!(js(&c, "return document.getElementById('sort').value").await, "size");
        screenshot(&c, "seed-event-12").await;
        c.close().await.unwrap();
    });
}

/// The seed snapshot with hostile text in its frames, written by python3's pickle.
const PY_EVIL: &str = r#"
import pickle, sys
s = pickle.load(open(sys.argv[1], 'rb'))
evil = ['<script>window.__pwned=1</script>', '"><img src=x onerror="window.__pwned=2">']
def poison(frames):
    for i, f in enumerate(frames):
        f['name'] = evil[i % 2]
        f['filename'] = evil[(i + 1) % 2] + '.py'
for seg in s['segments']:
    for b in seg['blocks']:
        poison(b['frames'])
for e in s['device_traces'][0]:
    poison(e.get('frames', []))
    e['user_metadata'] = '<script>window.__pwned=5</script>'
    e['compile_context'] = '<img src=x onerror="window.__pwned=6">'
pickle.dump(s, open(sys.argv[2], 'wb'))
print('null')
"#;

#[test]
fn script_in_frame_names_user_metadata_file_names_and_notes_runs_nowhere() {
    let Some(d) = driver() else { return };
    let dir = tempfile::tempdir().unwrap();
    let evil = dir.path().join("evil.pickle");
    python_json(PY_EVIL, &[&snapshot_path("seed_frag_default"), &evil]);
    let server = TestServer::start(&[]);
    // The name and the note travel in a multipart form, as the browser's form would send them.
    let form = reqwest::blocking::multipart::Form::new()
        .file("file", &evil)
        .unwrap()
        .text("name", "<img src=x onerror=\"window.__pwned=3\">")
        .text("note", "<script>window.__pwned=4</script>");
    let r = TestServer::client().post(server.url("/api/v1/snapshots")).multipart(form).send().unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let id = r.json::<Value>().unwrap()["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    runtime().block_on(async {
        let c = browser(&d).await;
        c.goto(&server.url(&format!("/s/{id}"))).await.unwrap();
        wait_ready(&c).await;
        // Show every text the page can show: the tooltip and details of a live block.
        js(&c, "document.getElementById('segmap').scrollIntoView({block: 'center'})").await;
        let l = layout(&c).await;
        let canvas = c.find(Locator::Css("#segmap")).await.unwrap();
        let w = js(&c, "return document.getElementById('segmap').clientWidth").await.as_f64().unwrap();
        let h = js(&c, "return document.getElementById('segmap').clientHeight").await.as_f64().unwrap();
        let x = l["label"].as_f64().unwrap() + 40.0;
        let y = l["top"].as_f64().unwrap() + 8.0;
        let click = MouseActions::new("mouse".into())
            .then(PointerAction::MoveToElement {
                element: canvas,
                x: (x - w / 2.0).round(),
                y: (y - h / 2.0).round(),
                duration: None,
            })
            .then(PointerAction::Down { button: 0 })
            .then(PointerAction::Up { button: 0 });
        c.perform_actions(click).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let text = js(&c, "return document.body.innerText").await.as_str().unwrap().to_string();
        assert!(text.contains("<script>window.__pwned=1</script>"), "frame names are shown as text");
        assert!(text.contains("<img src=x onerror=\"window.__pwned=3\">"), "the name is shown as text");
        assert!(text.contains("<script>window.__pwned=4</script>"), "the note is shown as text");
        assert!(text.contains("<script>window.__pwned=5</script>"), "the event's user metadata is shown as text");
        assert_eq!(js(&c, "return window.__pwned === undefined").await, json!(true), "a script ran");
        assert_eq!(
            js(&c, "return document.querySelectorAll('img').length").await,
            json!(0),
            "markup from the snapshot was rendered"
        );
        screenshot(&c, "hostile-text").await;
        c.goto(&server.url("/")).await.unwrap();
        assert_eq!(
            js(&c, "return window.__pwned === undefined && document.querySelectorAll('img').length === 0").await,
            json!(true)
        );
        c.close().await.unwrap();
    });
}

/// Colouring by what blocks hold: the link reopens it, the map paints activations in their
/// colour, the active chart has one series per category, and the timeline marks the steps.
#[test]
fn the_map_and_the_active_chart_colour_by_category_and_the_timeline_marks_steps() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let path = fixtures().join("categories/ranks3_rank1.pickle.zst");
    let id = server.upload(&path)["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    runtime().block_on(async {
        let c = browser(&d).await;
        c.goto(&server.url(&format!("/s/{id}#c=category"))).await.unwrap();
        wait_ready(&c).await;
        assert_eq!(js(&c, "return document.getElementById('colour').value").await, json!("category"));
        assert_eq!(js(&c, "return document.getElementById('category-legend').hidden").await, json!(false));
        // Somewhere on the map, a block in the activation colour (#d9822b).
        let found = js(
            &c,
            "const cv = document.getElementById('segmap'); const d = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
             for (let i = 0; i < d.length; i += 4) if (d[i] === 217 && d[i + 1] === 130 && d[i + 2] === 43) return true; return false;",
        )
        .await;
        assert_eq!(found, json!(true), "no activation-coloured block on the map");
        let legend = js(&c, "return [...document.querySelectorAll('#active-legend li')].map(l => l.textContent)").await;
        assert!(legend.as_array().unwrap().iter().any(|l| l == "activation"), "{legend}");
        let steps = js(&c, "return Number(document.getElementById('timeline').dataset.steps)").await;
        assert!(steps.as_u64().unwrap() >= 3, "step lines drawn: {steps}");
        // Labelled from 1, as the diagnosis counts them ("died in step 4").
        let labels = js(&c, "return document.getElementById('timeline').dataset.stepLabels").await;
        let labels: Vec<&str> = labels.as_str().unwrap().split(',').collect();
        assert_eq!(labels[0], "step 1", "{labels:?}");
        assert!(labels.len() >= 2 && labels[1].parse::<u32>().unwrap() >= 2, "{labels:?}");
        screenshot(&c, "colour-by-category").await;
        // Back to call sites: the fragment forgets the colouring.
        c.execute("const s = document.getElementById('colour'); s.value = 'site'; s.dispatchEvent(new Event('change'));", vec![])
            .await
            .unwrap();
        assert!(!c.current_url().await.unwrap().fragment().unwrap_or("").contains("c=category"));
        c.close().await.unwrap();
    });
}

/// A share link reopens what was shared: the sort and the selected block's details, opened
/// cold, are as they were in the view that made the link.
#[test]
fn a_link_opened_cold_restores_the_sort_and_the_selected_blocks_details() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let id = server.upload(&snapshot_path("seed_frag_default"))["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    let map = server.get_json(&format!("/api/v1/snapshots/{id}/devices/0/state"));
    let live = map["segments"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["blocks"].as_array().unwrap().clone())
        .find(|b| b["state"] == "active_allocated")
        .unwrap();
    let address = live["address"].as_str().unwrap().to_string();
    runtime().block_on(async {
        let c = browser(&d).await;
        // The view that makes the link: sort by pinned bytes through the page's own control.
        c.goto(&server.url(&format!("/s/{id}"))).await.unwrap();
        wait_ready(&c).await;
        c.execute(
            "const s = document.getElementById('sort'); s.value = 'pinned'; s.dispatchEvent(new Event('change'));",
            vec![],
        )
        .await
        .unwrap();
        let made = layout(&c).await["order"].clone();
        // The same view, opened cold from a link.
        let url = server.url(&format!("/s/{id}#sort=pinned&sel={address}"));
        c.goto(&server.url("/")).await.unwrap();
        c.goto(&url).await.unwrap();
        wait_ready(&c).await;
        assert_eq!(js(&c, "return document.getElementById('sort').value").await, json!("pinned"));
        assert_eq!(layout(&c).await["order"], made, "the rows are in the order the link was made in");
        assert_eq!(js(&c, "return document.getElementById('details').hidden").await, json!(false));
        let details = js(&c, "return document.getElementById('details').textContent").await;
        assert!(details.as_str().unwrap().contains(&address), "{details}");
        c.close().await.unwrap();
    });
}

/// The first view's data is asked for once, by the head's early module, while the rest of
/// the page loads: each data request of a page load goes out once (a URL the page built
/// differently would go out twice), and the page still draws what the link asks for.
///
/// And drawn once for each piece of data that changes a drawing, not once more for each
/// setter and resize it passes through: the map when its state arrives, and again only if the
/// analysis's colours come after it; the timeline when its columns arrive, and again only if
/// the map's totals for the cursor come after them. (Before, the map drew three times and the
/// timeline three or four: the pinners' unchanged highlight and the resize that the map's own
/// height set each drew again, as did the cursor set after the data.)
#[test]
fn a_page_load_asks_for_and_draws_each_piece_of_its_first_view_once() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let id = server.upload(&snapshot_path("two_devices"))["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    runtime().block_on(async {
        let c = browser(&d).await;
        for fragment in ["", "#d=1&e=3&c=category", "#e=2&r=1-5"] {
            c.goto("about:blank").await.unwrap();
            c.goto(&server.url(&format!("/s/{id}{fragment}"))).await.unwrap();
            wait_ready(&c).await;
            let urls = js(
                &c,
                "return performance.getEntriesByType('resource').map(e => e.name).filter(n => n.includes('/devices/'))",
            )
            .await;
            let urls: Vec<String> = urls.as_array().unwrap().iter().map(|u| u.as_str().unwrap().to_string()).collect();
            for kind in ["/state?", "/pinners?", "/timeline?", "/active?"] {
                let n = urls.iter().filter(|u| u.contains(kind)).count();
                assert_eq!(n, 1, "{fragment}: {kind} asked {n} times: {urls:?}");
            }
            if fragment.contains("d=1") {
                assert!(urls.iter().all(|u| u.contains("/devices/1/")), "{urls:?}");
                assert!(urls.iter().any(|u| u.contains("state?event=3")), "{urls:?}");
                assert!(urls.iter().any(|u| u.contains("by=category")), "{urls:?}");
            }
            if fragment.contains("r=1-5") {
                assert!(urls.iter().any(|u| u.contains("timeline?start=1&end=5")), "{urls:?}");
            }
            // A frame or two for a resize observer's callback to come.
            js(&c, "return new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => done(1))))")
                .await;
            for canvas in ["segmap", "timeline"] {
                let draws =
                    js(&c, &format!("return Number(document.getElementById('{canvas}').dataset.draws || 0)")).await;
                let draws = draws.as_f64().unwrap();
                assert!((1.0..=2.0).contains(&draws), "{fragment}: #{canvas} was drawn with data {draws} times");
            }
        }
        // A window resized is still drawn again at its new size.
        let before = js(&c, "return Number(document.getElementById('segmap').dataset.draws)").await.as_f64().unwrap();
        c.set_window_size(900, 1000).await.unwrap();
        wait_for(&c, &format!("return Number(document.getElementById('segmap').dataset.draws) > {before}")).await;
        c.close().await.unwrap();
    });
}

/// A capacity OOM that a batch too big for its budget made: the headline says what the step
/// needed against the budget, and the timeline draws that need above the trace's end with the
/// budget's line, since the snapshot ends at the OOM (#30).
#[test]
fn the_page_shows_what_the_step_needed_against_the_budget() {
    let Some(d) = driver() else { return };
    let server = TestServer::start(&[]);
    let id = server.upload(&fixtures().join("jobs/ladder_b20_oom.pickle.zst"))["id"].as_str().unwrap().to_string();
    server.wait_done(&id);
    let need = server.get_json(&format!("/api/v1/snapshots/{id}/diagnosis"))[0]["diagnosis"]["need"].clone();
    runtime().block_on(async {
        let c = browser(&d).await;
        c.goto(&server.url(&format!("/s/{id}"))).await.unwrap();
        wait_ready(&c).await;
        let head = js(&c, "return document.querySelector('.verdict h2').textContent").await;
        assert!(head.as_str().unwrap().starts_with("Out of memory: capacity: the step needs"), "{head}");
        let drawn =
            js(&c, "const t = document.getElementById('timeline').dataset; return [Number(t.need), Number(t.budget)]")
                .await;
        assert_eq!(drawn, json!([need["peak_reserved_bytes"], need["budget_bytes"]]), "{need}");
        let badges = js(&c, "return [...document.querySelectorAll('.remedy .tag')].map(t => t.textContent)").await;
        assert!(badges.as_array().unwrap().iter().any(|b| b == "fixes it"), "{badges}");
        screenshot(&c, "capacity-need").await;
        c.close().await.unwrap();
    });
}
