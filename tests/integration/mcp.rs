//! `fragscope mcp` driven as an MCP client drives it: initialize, tools/list, tools/call on
//! stdin/stdout. Each tool's answer is the same JSON as the API's (and the CLI's `--json`);
//! a bad file answers with a tool error naming it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::util::*;

struct Session {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Session {
    fn start() -> Session {
        let mut child = Command::new(bin()).arg("mcp").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Session { child, out, next: 1 }
    }

    fn send(&mut self, message: Value) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    /// A request and its answer's `result` (or `error`).
    fn ask(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            assert!(self.out.read_line(&mut line).unwrap() > 0, "the server closed its output");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == json!(id) {
                return if v.get("error").is_some() { v["error"].clone() } else { v["result"].clone() };
            }
        }
    }

    fn call(&mut self, tool: &str, arguments: Value) -> (bool, String) {
        let r = self.ask("tools/call", json!({"name": tool, "arguments": arguments}));
        (r["isError"] == json!(true), r["content"][0]["text"].as_str().unwrap_or_default().to_string())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cli_json(args: &[&str]) -> Value {
    let out = Command::new(bin()).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn an_agent_gets_the_cli_s_answers_through_mcp() {
    let file = snapshot_path("capacity_oom");
    let f = file.to_str().unwrap();
    let mut s = Session::start();
    let init = s.ask(
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}),
    );
    assert_eq!(init["serverInfo"]["name"], "fragscope", "{init}");
    s.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let tools = s.ask("tools/list", json!({}));
    let mut names: Vec<&str> = tools["tools"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["analyze", "breakdown", "compare", "simulate", "state"]);
    // analyze: the CLI's --json document.
    let (err, text) = s.call("analyze", json!({"file": f}));
    assert!(!err, "{text}");
    let got: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(got, cli_json(&["analyze", "--json", f]));
    // breakdown and state at the OOM, which the analysis names.
    let oom = got["devices"][0]["ooms"][0]["event_index"].as_u64().unwrap();
    let (err, text) = s.call("breakdown", json!({"file": f, "event": "oom"}));
    assert!(!err, "{text}");
    let b: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(b["event_index"], json!(oom));
    let (err, text) = s.call("state", json!({"file": f, "event": oom}));
    assert!(!err, "{text}");
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["event"], json!(oom));
    // simulate and compare: the CLI's documents.
    let (err, text) = s.call("simulate", json!({"file": f, "conf": "expandable_segments:True"}));
    assert!(!err, "{text}");
    let sim = cli_json(&["simulate", "--json", "--conf", "expandable_segments:True", f]);
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), sim);
    let other = snapshot_path("seed_frag_default");
    let (err, text) = s.call("compare", json!({"a": f, "b": other.to_str().unwrap()}));
    assert!(!err, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        cli_json(&["compare", "--json", f, other.to_str().unwrap()])
    );
    // Errors say what is wrong, and the server keeps answering.
    let (err, text) = s.call("analyze", json!({"file": "/no/such.pickle"}));
    assert!(err && text.contains("/no/such.pickle"), "{text}");
    let (err, text) = s.call("state", json!({"file": f, "event": 99999999}));
    assert!(err && text.contains("event must be"), "{text}");
    let hostile = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile");
    let mut tried = 0;
    for bad in std::fs::read_dir(&hostile).unwrap().filter_map(|e| e.ok()).take(5) {
        let (err, text) = s.call("analyze", json!({"file": bad.path().to_str().unwrap()}));
        tried += 1;
        assert!(err || serde_json::from_str::<Value>(&text).is_ok(), "{}: {text}", bad.path().display());
    }
    assert_eq!(tried, 5, "the hostile corpus is there");
    let (err, _) = s.call("breakdown", json!({"file": f}));
    assert!(!err, "still serving after errors");
}
