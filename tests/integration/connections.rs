//! Connections that never send a request: idle or half-sent heads are closed after the
//! header timeout, the number served at once is capped, and running out of file descriptors
//! is logged once and survived.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;

fn healthz(base: &str) -> bool {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
        .get(format!("{base}/healthz"))
        .send()
        .is_ok_and(|r| r.status().is_success())
}

/// Idle and half-sent connections past the cap: the server closes them after the header
/// timeout and keeps answering.
#[test]
fn idle_and_half_sent_connections_are_closed_and_the_server_keeps_answering() {
    let server = TestServer::start(&["--request-timeout", "2", "--max-connections", "64"]);
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut held = Vec::new();
    for i in 0..200 {
        let mut s = TcpStream::connect(&addr).unwrap();
        if i % 2 == 0 {
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap(); // never finished
        }
        held.push(s);
    }
    let start = Instant::now();
    while !healthz(&server.base) {
        assert!(start.elapsed() < Duration::from_secs(30), "the server never answered again");
    }
    // Every one of them was closed by the server (a read reaches the end, or a reset) rather
    // than held open.
    let mut open = 0;
    for s in held.iter_mut() {
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut rest = Vec::new();
        if let Err(e) = s.read_to_end(&mut rest)
            && matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
        {
            open += 1;
        }
    }
    assert_eq!(open, 0, "connections the server never closed");
}

/// Under `ulimit -n 128`, 300 idle connections exhaust the descriptors: the failure is logged
/// once (not once per accept), and the server answers again once the idle ones are cut off.
#[test]
fn running_out_of_descriptors_is_logged_once_and_survived() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -n 128; exec \"$0\" serve --addr 127.0.0.1:0 --data-dir \"$1\" --request-timeout 2 --max-connections 1000")
        .arg(bin())
        .arg(dir.path().join("data"))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut line = String::new();
    {
        use std::io::BufRead;
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        out.read_line(&mut line).unwrap();
    }
    let base = line.trim().rsplit(' ').next().unwrap().to_string();
    let addr = base.trim_start_matches("http://").to_string();
    let held: Vec<TcpStream> = (0..300).filter_map(|_| TcpStream::connect(&addr).ok()).collect();
    assert!(held.len() > 150, "the kernel queue took the connections");
    std::thread::sleep(Duration::from_secs(1));
    let start = Instant::now();
    while !healthz(&base) {
        assert!(start.elapsed() < Duration::from_secs(40), "the server never answered again");
    }
    drop(held);
    child.kill().unwrap();
    child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    let failures = text.matches("cannot accept connections").count();
    assert_eq!(failures, 1, "logged {failures} times:\n{text}");
}
