//! Signals (issue 10): SIGQUIT and SIGUSR1 drain like SIGTERM (chains in flight are decided, not
//! lost); SIGHUP reloads a valid configuration in place (what changed is applied, nothing is
//! closed; see also e2e_reload), keeps the running one for an invalid file (logged), and the
//! service goes on.

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
async fn sighup_reloads_a_valid_configuration_and_keeps_the_running_one_for_an_invalid_file() {
    let svc = Service::start(Cfg { exporter: None, ..Cfg::default() }).await;
    let pid = svc.pid().to_string();
    let hup = || std::process::Command::new("kill").args(["-HUP", &pid]).status().expect("kill");
    // A valid new file: the verdict log moves from stdout to a file. After SIGHUP the running
    // pipeline writes to it, on the same ports.
    let log = svc.dir().join("verdicts.jsonl");
    let text = std::fs::read_to_string(&svc.config_path).unwrap();
    assert!(text.contains("  verdict_log:\n    path: stdout\n"), "{text}");
    let moved = text.replace("  verdict_log:\n    path: stdout\n", &format!("  verdict_log:\n    path: {}\n", log.display()));
    std::fs::write(&svc.config_path, &moved).unwrap();
    assert!(hup().success());
    eventually(Duration::from_secs(20), "the new file applied", || svc.stderr().contains("new configuration is applied").then_some(()))
        .await;
    eventually_async(Duration::from_secs(20), "the health check back", || async { (svc.health_status().await == Some(200)).then_some(()) })
        .await;
    send_eight_calls(&svc).await;
    let lines = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default().lines().filter(|l| l.contains("\"state\"")).count();
    eventually(Duration::from_secs(30), "eight verdicts in the new verdict log", || (lines(&log) >= 8).then_some(())).await;
    assert!(svc.verdicts().is_empty(), "nothing went to stdout after the reload");

    // An invalid file: logged, the running configuration kept, the service goes on.
    std::fs::write(&svc.config_path, "receivers: [not, a, map]\n").unwrap();
    assert!(hup().success());
    eventually(Duration::from_secs(10), "the invalid file logged", || svc.stderr().contains("configuration file is invalid").then_some(()))
        .await;
    assert!(svc.running(), "SIGHUP never stops the service");
    assert_eq!(svc.health_status().await, Some(200));
    let before = lines(&log);
    let lines2 = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/nine_states.jsonl")).unwrap();
    for l in lines2.lines().filter(|l| !l.trim().is_empty()) {
        assert_eq!(svc.post_json(l.as_bytes()).await.status, 200);
    }
    eventually(Duration::from_secs(30), "the running configuration still decides", || (lines(&log) > before).then_some(())).await;
}
