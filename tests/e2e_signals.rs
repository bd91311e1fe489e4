//! Signals (issue 10): SIGQUIT and SIGUSR1 drain like SIGTERM (chains in flight are decided, not
//! lost); SIGHUP checks the configuration again (an invalid file is logged and the running one
//! kept) and reopens the verdict log, and the service goes on.

mod support;

use std::time::Duration;

use support::*;

async fn send_eight_calls(svc: &Service) {
    let lines = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/eight_calls.jsonl")).unwrap();
    for l in lines.lines().filter(|l| !l.trim().is_empty()) {
        assert_eq!(svc.post_json(l.as_bytes()).await.status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_and_sigusr1_drain_like_sigterm() {
    for sig in ["QUIT", "USR1"] {
        // A long decision_wait: the calls are still in flight when the signal comes.
        let svc = Service::start(Cfg { exporter: None, decision_wait: "1m", max_wait: "2m", ..Cfg::default() }).await;
        send_eight_calls(&svc).await;
        let st = svc.signal_and_wait(sig, Duration::from_secs(15)).await.expect("exits");
        assert!(st.success(), "SIG{sig}: {st:?}");
        let v = svc.verdicts();
        assert_eq!(v.iter().filter(|v| v["decided_by"] == "shutdown").count(), 8, "SIG{sig}: the chains in flight were decided: {v:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_checks_the_configuration_and_keeps_running() {
    let svc = Service::start(Cfg { exporter: None, ..Cfg::default() }).await;
    let pid = svc.pid().to_string();
    let hup = || std::process::Command::new("kill").args(["-HUP", &pid]).status().expect("kill");
    assert!(hup().success());
    eventually(Duration::from_secs(10), "the valid reload logged", || svc.stderr().contains("configuration file is valid").then_some(()))
        .await;
    std::fs::write(&svc.config_path, "receivers: [not, a, map]\n").unwrap();
    assert!(hup().success());
    eventually(Duration::from_secs(10), "the invalid file logged", || svc.stderr().contains("configuration file is invalid").then_some(()))
        .await;
    assert!(svc.running(), "SIGHUP never stops the service");
    assert_eq!(svc.health_status().await, Some(200));
    send_eight_calls(&svc).await;
    svc.wait_verdicts(8, Duration::from_secs(30)).await;
}
