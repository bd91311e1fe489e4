//! The status page: `/status` (HTML, drawn on the server, no scripts, no external assets) and
//! `/status.json` on the health-check listener, for people without Grafana. It is better than a
//! dashboard at one thing: explaining a verdict — for each open incident and recent call, which
//! spans it rests on, which layer decided, what was missing, the authority needed and the next
//! action.
//!
//! Fed by [`StatusSink`](crate::emit::status::StatusSink) from the engine's records; queue fills
//! are read when the page is drawn. Every value is HTML-escaped: server and tool names come from
//! servers nobody vetted.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::emit::sink::Sink;
use crate::emit::status::{CallView, IncidentView, QueueFill, SharedStatus, StatusSink, StatusSnapshot, StatusView};
use crate::evidence::time::Moment;
use crate::flow::queue::Queue;

/// Reads one queue's depth and capacity; `None` once the queue is closed.
type Probe = Box<dyn Fn() -> Option<(usize, usize)> + Send + Sync>;

/// The status page's state: the snapshot and the queues it reports.
#[derive(Clone, Default)]
pub struct Status {
    snapshot: SharedStatus,
    queues: Arc<std::sync::Mutex<Vec<(&'static str, Probe)>>>,
}

impl Status {
    /// A page reporting the exporter queues that exist (own output, pass-through).
    pub fn new<T: Send + 'static>(exporters: [Option<&Queue<T>>; 2]) -> Status {
        let s = Status { snapshot: StatusSnapshot::shared(), queues: Arc::default() };
        for q in exporters.into_iter().flatten() {
            s.watch_queue(q);
        }
        s
    }

    /// Report a queue's fill, under its name. Through its gauge: the page never keeps a queue open.
    pub fn watch_queue<T: Send + 'static>(&self, q: &Queue<T>) {
        let gauge = q.gauge();
        let name = gauge.name();
        let probe: Probe = Box::new(move || gauge.depth().map(|d| (d, gauge.capacity())));
        self.queues.lock().unwrap_or_else(|p| p.into_inner()).push((name, probe));
    }

    /// The sink that keeps the page's snapshot.
    pub fn sink(&self) -> impl Sink + 'static {
        StatusSink(self.snapshot.clone())
    }

    /// What the page shows now.
    pub fn view(&self) -> StatusView {
        let queues = self
            .queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(name, probe)| probe().map(|(depth, capacity)| QueueFill { name, depth, capacity }))
            .collect();
        self.snapshot.lock().unwrap_or_else(|p| p.into_inner()).view(Moment::wall_now(), queues)
    }

    /// `/status` and `/status.json`, to merge into the health-check router.
    pub fn routes(&self) -> Router {
        let (a, b) = (self.clone(), self.clone());
        Router::new()
            .route(
                "/status",
                get(move || {
                    let s = a.clone();
                    async move {
                        ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-store")], render_html(&s.view()))
                            .into_response()
                    }
                }),
            )
            .route(
                "/status.json",
                get(move || {
                    let s = b.clone();
                    async move { ([(header::CACHE_CONTROL, "no-store")], axum::Json(s.view())).into_response() }
                }),
            )
    }
}

/// Text made safe for HTML element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// The first `n` bytes of an identifier (a hash, a digest), or all of it when that is no boundary.
fn short(s: &str, n: usize) -> &str {
    s.get(..n).unwrap_or(s)
}

fn opt(s: Option<&str>) -> String {
    s.map_or_else(|| "—".to_string(), esc)
}

fn pct(r: Option<f64>) -> String {
    r.map_or_else(|| "—".to_string(), |r| format!("{:.1} %", r * 100.0))
}

/// How long before `now` an evidence time was, in words.
fn ago(now_ns: u64, t_ns: u64) -> String {
    if t_ns == 0 {
        return "—".into();
    }
    let s = now_ns.saturating_sub(t_ns) / 1_000_000_000;
    match s {
        0..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=86_399 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

fn utc(ns: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns)).to_string()
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2330;background:#fafbfc}\
h1{font-size:1.5em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.6em 0 .4em;border-bottom:1px solid #d0d7de;padding-bottom:.2em}\
table{border-collapse:collapse;width:100%;background:#fff}th,td{border:1px solid #d0d7de;padding:.3em .5em;text-align:left;vertical-align:top}\
th{background:#f0f3f6}code{font:12px ui-monospace,monospace;word-break:break-all}.muted{color:#57606a}\
.bad{color:#b42318;font-weight:600}.ok{color:#1a7f37;font-weight:600}.warn{color:#9a6700;font-weight:600}\
.chain{margin:.3em 0 0;padding:.4em .6em;background:#f6f8fa;border-left:3px solid #8c959f}\
.chain ol{margin:.2em 0;padding-left:1.4em}.layers span{display:inline-block;margin-right:.4em;padding:0 .3em;border-radius:3px}\
.l-passed{background:#dafbe1}.l-failed{background:#ffd8d3}.l-unobserved{background:#eaeef2}\
.bar{display:inline-block;width:120px;height:.8em;background:#eaeef2;vertical-align:middle}.bar i{display:block;height:100%;background:#0969da}";

/// The page.
pub fn render_html(v: &StatusView) -> String {
    let mut h = String::with_capacity(16 * 1024);
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>mcp-health status</title>\
<meta name=\"viewport\" content=\"width=device-width\"><style>{STYLE}</style></head><body>\
<h1>mcp-health status</h1><p class=\"muted\">Drawn at {} (UTC). Reload for the latest. Machine-readable: <a href=\"/status.json\">/status.json</a>.</p>",
        utc(v.generated_at_ns)
    );
    summary(&mut h, v);
    rates(&mut h, v);
    incidents(&mut h, v);
    catalogs(&mut h, v);
    drift(&mut h, v);
    queues(&mut h, v);
    recent(&mut h, v);
    let evicted: Vec<String> = v.evicted.iter().filter(|(_, n)| *n > 0).map(|(t, n)| format!("{} {n}", esc(t))).collect();
    if !evicted.is_empty() {
        let _ = write!(h, "<p class=\"muted\">Pushed out of this page's bounded tables so far: {}.</p>", evicted.join(", "));
    }
    h.push_str("</body></html>\n");
    h
}

/// One line: how many incidents, servers, sessions off their catalog, and the fullest queue.
fn summary(h: &mut String, v: &StatusView) {
    let off = v.catalogs.iter().filter(|c| c.convergence != "converged").count();
    let fullest = v.queues.iter().max_by(|a, b| {
        let f = |q: &QueueFill| if q.capacity == 0 { 0.0 } else { q.depth as f64 / q.capacity as f64 };
        f(a).total_cmp(&f(b))
    });
    let _ = write!(
        h,
        "<p class=\"summary\"><b class=\"{}\">{} open incident(s)</b> · {} server(s) · {} of {} session catalog(s) not converged · {} drift report(s){}</p>",
        if v.incidents.is_empty() { "ok" } else { "bad" },
        v.incidents.len(),
        v.servers.len(),
        off,
        v.catalogs.len(),
        v.drift.len(),
        fullest.map(|q| format!(" · fullest queue: {} {} / {}", esc(q.name), q.depth, q.capacity)).unwrap_or_default(),
    );
}

fn incidents(h: &mut String, v: &StatusView) {
    let _ = write!(h, "<h2 id=\"incidents\">Open incidents ({})</h2>", v.incidents.len());
    if v.incidents.is_empty() {
        h.push_str("<p class=\"ok\">No open incidents.</p>");
    } else {
        h.push_str(
            "<table class=\"incidents\"><tr><th>Server</th><th>First failed layer</th><th>State / error</th><th>Tool</th>\
<th>Required authority</th><th>Next action</th><th>Impact</th><th>Last evidence</th></tr>",
        );
        for i in &v.incidents {
            incident_row(h, v.generated_at_ns, i);
        }
        h.push_str("</table>");
    }
    if !v.resolved_incidents.is_empty() {
        let _ = write!(h, "<p class=\"muted\">Resolved lately: {}.</p>", {
            let r: Vec<String> = v
                .resolved_incidents
                .iter()
                .map(|i| format!("{} at {} on {}", esc(i.state), opt(i.first_failed_layer), opt(i.server.as_deref())))
                .collect();
            r.join("; ")
        });
    }
}

fn incident_row(h: &mut String, now: u64, i: &IncidentView) {
    let waiting = if i.incident_state == "waiting" { " <span class=\"warn\">(waiting: authorization flow pending)</span>" } else { "" };
    let _ = write!(
        h,
        "<tr class=\"incident\"><td>{}</td><td class=\"bad layer\">{}</td><td>{}{}</td><td>{}</td><td class=\"authority\">{}</td>\
<td class=\"next-action\">{}</td><td>{} call(s), {} session(s), agents: {}</td><td>{}</td></tr>",
        opt(i.server.as_deref()),
        opt(i.first_failed_layer),
        esc(i.state),
        i.error_class.as_deref().map(|e| format!(" <code>{}</code>", esc(e))).unwrap_or_default(),
        // An authorization incident is per credential; other causes without a tool (a failed
        // setup) have none.
        i.tool.as_deref().map_or_else(|| if i.state == "needs_auth" { "(every tool of the credential)" } else { "—" }.to_string(), esc),
        i.required_authority.as_deref().map_or_else(|| "—".to_string(), |a| format!("<code>{}</code>", esc(a))),
        esc(&i.next_action),
        i.calls,
        i.sessions,
        if i.agents.is_empty() { "—".to_string() } else { i.agents.iter().map(|a| esc(a)).collect::<Vec<_>>().join(", ") },
        ago(now, i.last_evidence_ns),
    );
    h.push_str("<tr><td colspan=\"8\">");
    if !waiting.is_empty() {
        h.push_str(waiting);
    }
    match &i.evidence {
        Some(c) => chain(h, c),
        None => h.push_str("<div class=\"chain muted\">No call of this incident was decided by this instance since it started.</div>"),
    }
    h.push_str("</td></tr>");
}

/// A call's evidence chain: its spans, the layers, the layer that decided and what was missing.
fn chain(h: &mut String, c: &CallView) {
    let _ = write!(
        h,
        "<div class=\"chain\"><b>Evidence chain</b> of {} <code>{}</code> on {} (trace <code>{}</code>, span <code>{}</code>{}): <ol>",
        opt(c.method.as_deref()),
        opt(c.tool.as_deref()),
        opt(c.server.as_deref()),
        esc(&c.trace_id),
        esc(&c.span_id),
        c.session_id_hash.as_deref().map(|s| format!(", session hash <code>{}</code>", esc(short(s, 16)))).unwrap_or_default(),
    );
    for l in &c.chain {
        let _ = write!(h, "<li class=\"span\">{} × {} span ({})</li>", l.spans, esc(l.kind), esc(l.instrumentation));
    }
    if c.chain.is_empty() {
        h.push_str("<li class=\"muted\">no span recorded (restored from the state store)</li>");
    }
    h.push_str("</ol><div class=\"layers\">Layers: ");
    for (l, s) in &c.layers {
        let _ = write!(h, "<span class=\"l-{}\">{} {}</span>", esc(s), esc(l), esc(s));
    }
    let _ = write!(
        h,
        "</div><div>Decided: <b class=\"decided\">{}</b> — state <b>{}</b>, confidence {}, decided by {}{}.</div>",
        esc(&c.decided_layer),
        esc(c.state),
        esc(c.confidence),
        esc(c.decided_by),
        if c.revision > 0 { format!(", revision {}", c.revision) } else { String::new() },
    );
    if c.missing.is_empty() {
        h.push_str("<div class=\"missing\">Missing: nothing.</div>");
    } else {
        let _ = write!(h, "<div class=\"missing\">Missing: {}.</div>", c.missing.iter().map(|m| esc(m)).collect::<Vec<_>>().join("; "));
    }
    let _ = write!(h, "<div>Next action: {}</div></div>", esc(&c.next_action));
}

fn rates(h: &mut String, v: &StatusView) {
    let _ = write!(h, "<h2 id=\"rates\">Success rates per server ({})</h2>", v.servers.len());
    if v.servers.is_empty() {
        h.push_str("<p class=\"muted\">No attempts yet.</p>");
        return;
    }
    h.push_str(
        "<p class=\"muted\">Over attempts since this instance started. Protocol success: the server answered without a \
transport, protocol or authorization failure. Verified success: the intended outcome was observed (healthy). \
Unconfirmed: attempts no span shows answered or failed (the <code>mcp</code> SDK's client span alone): not counted as \
successes; server spans or the tap show their answers.</p>\
<table class=\"rates\"><tr><th>Server</th><th>Attempts</th><th>Protocol success</th><th>Verified success</th><th>Unconfirmed</th></tr>",
    );
    for s in &v.servers {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td class=\"protocol-rate\">{} <span class=\"muted\">({})</span></td>\
<td class=\"verified-rate\">{} <span class=\"muted\">({})</span></td><td class=\"unconfirmed\">{}</td></tr>",
            esc(&s.server),
            s.rates.attempts,
            pct(s.protocol_success_rate),
            s.rates.protocol_successes,
            pct(s.verified_success_rate),
            s.rates.verified_successes,
            s.rates.unconfirmed,
        );
    }
    h.push_str("</table>");
}

fn catalogs(h: &mut String, v: &StatusView) {
    let _ = write!(h, "<h2 id=\"catalogs\">Catalog state per client/session ({})</h2>", v.catalogs.len());
    if v.catalogs.is_empty() {
        h.push_str("<p class=\"muted\">No catalog evidence yet.</p>");
        return;
    }
    h.push_str("<table class=\"catalogs\"><tr><th>Session (hash)</th><th>Client</th><th>Server</th><th>State</th><th>Reason</th><th>Next step</th><th>Revision</th></tr>");
    for c in &v.catalogs {
        let class = if c.convergence == "converged" { "ok" } else { "bad" };
        let _ = write!(
            h,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            esc(short(&c.session_hash, 16)),
            opt(c.agent.as_deref()),
            opt(c.server.as_deref()),
            esc(c.convergence),
            esc(c.reason),
            esc(c.next_step),
            esc(c.protocol_revision),
        );
    }
    h.push_str("</table>");
}

fn drift(h: &mut String, v: &StatusView) {
    let _ = write!(h, "<h2 id=\"drift\">Contract drift ({})</h2>", v.drift.len());
    if v.drift.is_empty() {
        h.push_str("<p class=\"muted\">No tool definition differs from its pin (or no lockfile is configured).</p>");
        return;
    }
    h.push_str("<table class=\"drift\"><tr><th>Server</th><th>Tool</th><th>What changed</th><th>Pinned → seen</th></tr>");
    for d in &v.drift {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code> → <code>{}</code></td></tr>",
            esc(&d.server),
            esc(&d.tool),
            if d.changes.is_empty() { "—".to_string() } else { d.changes.iter().map(|c| esc(c)).collect::<Vec<_>>().join("<br>") },
            esc(short(&d.pinned_digest, 19)),
            esc(short(&d.digest, 19)),
        );
    }
    h.push_str("</table>");
}

fn queues(h: &mut String, v: &StatusView) {
    h.push_str("<h2 id=\"queues\">Queues</h2><table class=\"queues\"><tr><th>Queue</th><th>Depth / capacity</th><th>Fill</th></tr>");
    for q in &v.queues {
        let fill = if q.capacity == 0 { 0.0 } else { q.depth as f64 / q.capacity as f64 };
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{} / {}</td><td><span class=\"bar\"><i style=\"width:{:.0}%\"></i></span> {:.0} %</td></tr>",
            esc(q.name),
            q.depth,
            q.capacity,
            fill * 100.0,
            fill * 100.0
        );
    }
    h.push_str("</table>");
}

fn recent(h: &mut String, v: &StatusView) {
    let _ = write!(h, "<h2 id=\"recent\">Recent calls ({})</h2>", v.recent_calls.len());
    if v.recent_calls.is_empty() {
        h.push_str("<p class=\"muted\">No call decided yet.</p>");
        return;
    }
    h.push_str("<table class=\"recent\"><tr><th>When</th><th>Server</th><th>Method / tool</th><th>State</th><th>Explanation</th></tr>");
    for c in &v.recent_calls {
        let class = match c.state {
            "healthy" => "ok",
            "unverified" | "working" | "waiting" => "warn",
            _ => "bad",
        };
        let _ = write!(
            h,
            "<tr class=\"call\"><td>{}</td><td>{}</td><td>{} <code>{}</code></td><td class=\"{class}\">{}</td><td>",
            ago(v.generated_at_ns, c.end_ns),
            opt(c.server.as_deref()),
            opt(c.method.as_deref()),
            opt(c.tool.as_deref()),
            esc(c.state),
        );
        chain(h, c);
        h.push_str("</td></tr>");
    }
    h.push_str("</table>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emit::status::StatusSnapshot;
    use crate::engine::Decided;
    use crate::verdict::{sample, Verdict};

    #[test]
    fn status_page_escapes_hostile_names() {
        let mut s = StatusSnapshot::default();
        let v = Verdict {
            server: Some(Arc::from("<script>alert(1)</script>")),
            tool: Some(Arc::from("\"><img src=x onerror=alert(2)>")),
            ..sample("tools/call", true, false)
        };
        s.accept(&[Decided::Call(v)]);
        let html = render_html(&s.view(Moment::from_nanos(1_000_000_000), vec![]));
        assert!(!html.contains("<script>") && !html.contains("<img"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("&quot;&gt;&lt;img src=x onerror=alert(2)&gt;"));
    }

    #[tokio::test]
    async fn status_queues_report_depth_and_capacity_and_never_hold_a_queue_open() {
        use crate::flow::queue::{bounded, OnFull};
        let (tx, mut rx) = bounded::<u8>("otlp", 4, OnFull::Refuse);
        let st = Status::new::<u8>([Some(&tx), None]);
        tx.reserve().unwrap().send(1);
        tx.reserve().unwrap().send(2);
        assert_eq!(st.view().queues, vec![QueueFill { name: "otlp", depth: 2, capacity: 4 }]);
        drop(tx);
        rx.recv().await;
        rx.recv().await;
        assert_eq!(rx.recv().await, None, "the page's probe does not keep the queue open");
        assert!(st.view().queues.is_empty());
    }
}
