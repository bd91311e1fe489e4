//! The Helm chart (deploy/helm/mcp-health), rendered as `helm template` renders it and checked:
//! every object of both modes against the Kubernetes v1.31 strict schemas and the
//! prometheus-operator CRDs (offline, tests/chart/schemas/), the pods' security context and probes,
//! the config checksum, `--set` overrides, the values schema refusing bad values, the
//! PrometheusRule and the dashboard being the shipped files, and the rendered mcp-health config
//! passing `mcp-health validate`.
//!
//! The renderer is tests/chart/render.py on helm-python-sdk (Helm v4's Go SDK in a PyPI wheel; there
//! is no helm package in Debian and nothing may be downloaded from elsewhere), the validator
//! tests/chart/validate.py on jsonschema, both in tests/chart/.venv (scripts/install-test-deps).
//! Missing: `SKIPPED: …` outside CI, a failure under CI.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const CHART: &str = "deploy/helm/mcp-health";

/// The venv's python, or `None` (said) when it is missing outside CI.
fn python() -> Option<PathBuf> {
    let p = root().join("tests/chart/.venv/bin/python");
    if p.is_file() {
        return Some(p);
    }
    assert!(std::env::var_os("CI").is_none(), "tests/chart/.venv is missing under CI: scripts/install-test-deps makes it");
    println!("SKIPPED: tests/chart/.venv is missing (scripts/install-test-deps makes it)");
    None
}

/// `helm template` with these `--set` expressions: the YAML stream, or the renderer's error.
fn render_raw(py: &Path, extra: &[&str], sets: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new(py);
    cmd.current_dir(root()).stdin(Stdio::null()).arg("tests/chart/render.py").arg(CHART).args(extra);
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("run tests/chart/render.py");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(stderr)
    }
}

/// Rendered objects, after every one passed its schema.
fn render(py: &Path, sets: &[&str]) -> Vec<Value> {
    render_with(py, &[], sets)
}

fn render_with(py: &Path, extra: &[&str], sets: &[&str]) -> Vec<Value> {
    let stream = render_raw(py, extra, sets).unwrap_or_else(|e| panic!("render {extra:?} {sets:?}: {e}"));
    validate(py, &stream, sets);
    let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&stream)
        .map(|d| serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("render {sets:?}: not YAML: {e}\n{stream}")))
        .filter(|v: &Value| !v.is_null())
        .collect();
    assert!(!docs.is_empty(), "render {sets:?}: no objects");
    docs
}

fn validate(py: &Path, stream: &str, sets: &[&str]) {
    use std::io::Write;
    let mut child = Command::new(py)
        .current_dir(root())
        .arg("tests/chart/validate.py")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tests/chart/validate.py");
    child.stdin.take().unwrap().write_all(stream.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "render {sets:?}: objects fail their Kubernetes schema:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn kinds(docs: &[Value]) -> BTreeSet<String> {
    docs.iter().map(|d| d["kind"].as_str().unwrap().to_owned()).collect()
}

fn one<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs.iter().filter(|d| d["kind"] == kind && d["metadata"]["name"] == name).collect();
    assert_eq!(found.len(), 1, "expected one {kind} {name}, found {}", found.len());
    found[0]
}

/// The mcp-health config of the release's ConfigMap, parsed.
fn config(docs: &[Value]) -> Value {
    let text = config_text(docs);
    serde_yaml_ng::from_str(&text).unwrap()
}

fn config_text(docs: &[Value]) -> String {
    one(docs, "ConfigMap", "mcp-health")["data"]["mcp-health.yaml"].as_str().unwrap().to_owned()
}

fn workload(docs: &[Value]) -> &Value {
    docs.iter().find(|d| (d["kind"] == "Deployment" || d["kind"] == "StatefulSet") && d["metadata"]["name"] == "mcp-health").unwrap()
}

fn checksum(docs: &[Value]) -> String {
    workload(docs)["spec"]["template"]["metadata"]["annotations"]["checksum/config"].as_str().unwrap().to_owned()
}

const STATEFULSET: &[&str] =
    &["mode=statefulset", "externalRedis.url=redis://redis.data:6379/0", "externalRedis.existingSecret=redis-auth"];
const WITH_REDIS: &[&str] = &[
    "mode=statefulset",
    "redis.enabled=true",
    "redis.auth.existingSecret=redis-auth",
    "podMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "grafanaDashboard.enabled=true",
];

/// Every combination the chart documents renders, and every object passes the Kubernetes (and
/// CRD) schema of its kind.
#[test]
fn both_modes_render_and_every_object_passes_its_schema() {
    let Some(py) = python() else { return };
    let deployment = render(&py, &[]);
    assert_eq!(
        kinds(&deployment),
        ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"].map(String::from).into(),
    );
    assert_eq!(workload(&deployment)["spec"]["replicas"], 1, "mode deployment is one instance");
    let sts = render(&py, STATEFULSET);
    assert_eq!(kinds(&sts), ["ConfigMap", "PodDisruptionBudget", "Service", "ServiceAccount", "StatefulSet"].map(String::from).into());
    let all = render(&py, WITH_REDIS);
    assert_eq!(
        kinds(&all),
        ["ConfigMap", "PodDisruptionBudget", "PodMonitor", "PrometheusRule", "Service", "ServiceAccount", "StatefulSet"]
            .map(String::from)
            .into(),
    );
    one(&all, "StatefulSet", "mcp-health-redis");
    one(&all, "ConfigMap", "mcp-health-dashboard");
    for sets in [&["state.enabled=true"][..], &["state.enabled=true", "state.existingClaim=mcp-health-state"]] {
        render(&py, sets);
    }
    for sets in [&[][..], WITH_REDIS] {
        let lint = render_raw(&py, &["--lint"], sets);
        assert!(lint.is_ok(), "helm lint --strict {sets:?}: {}", lint.unwrap_err());
    }
}

/// The pods run as the image's user with nothing writable but what the config needs, are probed on
/// the health endpoint the config serves, have a memory limit and a disruption budget, and are
/// given longer than the drain to stop.
#[test]
fn pods_are_locked_down_probed_limited_and_budgeted() {
    let Some(py) = python() else { return };
    for sets in [&[][..], STATEFULSET, &["state.enabled=true"]] {
        let docs = render(&py, sets);
        let pod = &workload(&docs)["spec"]["template"]["spec"];
        let psc = &pod["securityContext"];
        assert_eq!(psc["runAsNonRoot"], true, "{sets:?}");
        assert_eq!(psc["runAsUser"], 10001, "{sets:?}: the Dockerfile's uid");
        assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault", "{sets:?}");
        assert_eq!(pod["automountServiceAccountToken"], false, "{sets:?}");
        let c = &pod["containers"][0];
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{sets:?}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{sets:?}");
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{sets:?}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{sets:?}");
        assert!(c["resources"]["limits"]["memory"].is_string(), "{sets:?}: no memory limit");

        // Probes: `/` on the port named health, which is the config's health_check port.
        let cfg = config(&docs);
        let health_port: u64 = cfg["extensions"]["health_check"]["endpoint"].as_str().unwrap().rsplit(':').next().unwrap().parse().unwrap();
        let ports = c["ports"].as_array().unwrap();
        let named = |n: &str| ports.iter().find(|p| p["name"] == n).unwrap_or_else(|| panic!("no port {n}"))["containerPort"].as_u64();
        assert_eq!(named("health"), Some(health_port), "{sets:?}");
        for probe in ["livenessProbe", "readinessProbe"] {
            assert_eq!(c[probe]["httpGet"]["path"], "/", "{sets:?} {probe}");
            assert_eq!(c[probe]["httpGet"]["port"], "health", "{sets:?} {probe}");
        }
        for (port, key) in [("otlp-grpc", "grpc"), ("otlp-http", "http")] {
            let ep = cfg["receivers"]["otlp"]["protocols"][key]["endpoint"].as_str().unwrap();
            assert_eq!(ep, format!("0.0.0.0:{}", named(port).unwrap()), "{sets:?}");
        }

        // Writable: only the state directory, when the config keeps state there.
        let mounts = c["volumeMounts"].as_array().unwrap();
        let writable: Vec<&str> = mounts.iter().filter(|m| m["readOnly"] != true).map(|m| m["mountPath"].as_str().unwrap()).collect();
        let dir = cfg["storage"]["directory"].as_str();
        assert_eq!(writable, dir.into_iter().collect::<Vec<_>>(), "{sets:?}: writable mounts vs storage.directory");

        // The kubelet's SIGKILL comes after the drain.
        let drain = cfg["service"]["telemetry"]["shutdown_timeout"].as_str().unwrap();
        let drain: u64 = drain.strip_suffix('s').unwrap().parse().unwrap();
        assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() > drain, "{sets:?}");

        // The budget selects exactly the pods' selector.
        let pdb = one(&docs, "PodDisruptionBudget", "mcp-health");
        assert_eq!(pdb["spec"]["selector"], workload(&docs)["spec"]["selector"], "{sets:?}");
        assert_eq!(pdb["spec"]["maxUnavailable"], 1, "{sets:?}");
    }
}

/// The collector chart's pass-through values reach the container: extra arguments after the config,
/// variables (from Secrets too), and read-only mounts for the files a config names (TLS, lockfile).
#[test]
fn extra_args_env_and_volumes_reach_the_container() {
    let Some(py) = python() else { return };
    for sets in [&[][..], STATEFULSET] {
        let docs = render_with(&py, &["-f", "tests/chart/extra-values.yaml"], sets);
        let pod = &workload(&docs)["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        let args: Vec<&str> = c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(args, ["serve", "--config", "/etc/mcp-health/mcp-health.yaml", "--set", "service.telemetry.logs.level=debug"]);
        assert!(c["env"].as_array().unwrap().iter().any(|e| e["name"] == "OTLP_TOKEN"), "{sets:?}");
        assert_eq!(c["envFrom"][0]["secretRef"]["name"], "more", "{sets:?}");
        let tls = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == "tls").expect("the tls mount");
        assert_eq!(tls["readOnly"], true);
        assert!(pod["volumes"].as_array().unwrap().iter().any(|v| v["secret"]["secretName"] == "mcp-health-tls"), "{sets:?}");
    }
}

/// A config change (here a `--set` of the collector-style key) reaches the ConfigMap and changes
/// the pods' checksum, so an upgrade rolls them; a change elsewhere leaves the checksum alone.
#[test]
fn a_set_override_reaches_the_config_and_changes_the_checksum() {
    let Some(py) = python() else { return };
    let base = render(&py, &[]);
    let changed = render(&py, &["config.processors.memory_limiter.limit_mib=300"]);
    assert_eq!(config(&changed)["processors"]["memory_limiter"]["limit_mib"], 300);
    assert_eq!(config(&base)["processors"]["memory_limiter"], Value::Null, "the default leaves the limiter to 80 % of the limit");
    assert_ne!(checksum(&base), checksum(&changed), "a config change must roll the pods");
    let annotated = render(&py, &["podAnnotations.team=observability"]);
    assert_eq!(checksum(&base), checksum(&annotated), "the checksum covers the config only");
    // `null` removes a default, as in the collector chart.
    let no_log = render(&py, &["config.exporters.verdict_log=null"]);
    assert_eq!(config(&no_log)["exporters"]["verdict_log"], Value::Null);
    assert!(config(&base)["exporters"]["verdict_log"].is_object());
    // The config wins over what the chart derives.
    let moved = render(&py, &["config.extensions.health_check.status_page=false"]);
    assert_eq!(config(&moved)["extensions"]["health_check"]["status_page"], false);
    assert_eq!(config(&moved)["extensions"]["health_check"]["endpoint"], "0.0.0.0:13133");
}

/// Bad values are refused by values.schema.json (or a `required`) before anything renders, each
/// naming what is wrong.
#[test]
fn bad_values_fail_the_schema() {
    let Some(py) = python() else { return };
    for (sets, says) in [
        (&["mode=daemonset"][..], "/mode"),
        (&["resources.limits=null"], "limits"),
        (&["replicaCount=0"], "/replicaCount"),
        (&["replicas=3"], "replicas"),
        (&["securityContext.readOnlyRootFilesystem=false"], "readOnlyRootFilesystem"),
        (&["ports.health=70000"], "/ports/health"),
        // The password belongs in the Secret, never the ConfigMap.
        (&["mode=statefulset", "externalRedis.url=redis://:hunter2@redis:6379/0"], "/externalRedis/url"),
        // The cluster needs its store.
        (&["mode=statefulset"], "/externalRedis/url"),
    ] {
        match render_raw(&py, &[], sets) {
            Ok(_) => panic!("{sets:?} rendered; the schema must refuse it"),
            Err(e) => assert!(e.contains(says), "{sets:?}: the error does not name {says}: {e}"),
        }
    }
}

/// The shared-store cluster: a headless Service that keeps restarting pods on the ring and names
/// the pods' DNS subdomain, Redis as the store, the password from a Secret and nowhere in the
/// ConfigMap, and traces that predate a pod never green.
#[test]
fn statefulset_mode_is_the_shared_store_cluster() {
    let Some(py) = python() else { return };
    for sets in [STATEFULSET, WITH_REDIS] {
        let docs = render(&py, sets);
        let sts = one(&docs, "StatefulSet", "mcp-health");
        let svc = one(&docs, "Service", "mcp-health");
        assert_eq!(svc["spec"]["clusterIP"], "None", "{sets:?}");
        assert_eq!(svc["spec"]["publishNotReadyAddresses"], true, "{sets:?}");
        assert_eq!(sts["spec"]["serviceName"], "mcp-health", "{sets:?}");
        assert_eq!(sts["spec"]["replicas"], 3, "{sets:?}");
        let grpc = svc["spec"]["ports"].as_array().unwrap().iter().find(|p| p["name"] == "otlp-grpc").unwrap();
        assert_eq!(grpc["port"], 14317, "{sets:?}: the resolver dials the pods on this port");
        let cfg = config(&docs);
        assert_eq!(cfg["storage"]["kind"], "redis", "{sets:?}");
        assert_eq!(cfg["processors"]["mcp_health"]["partial_before_start"], true, "{sets:?}");
        let endpoint = cfg["storage"]["endpoint"].as_str().unwrap();
        assert!(endpoint.starts_with("redis://:${env:MCP_HEALTH_REDIS_PASSWORD}@"), "{sets:?}: {endpoint}");
        let env = &sts["spec"]["template"]["spec"]["containers"][0]["env"];
        let pw = env.as_array().unwrap().iter().find(|e| e["name"] == "MCP_HEALTH_REDIS_PASSWORD").expect("password env");
        assert_eq!(pw["valueFrom"]["secretKeyRef"]["name"], "redis-auth", "{sets:?}");
        assert!(!docs.iter().any(|d| d["kind"] == "Secret"), "{sets:?}: the chart makes no Secret");
    }
    let docs = render(&py, WITH_REDIS);
    let endpoint = config(&docs)["storage"]["endpoint"].as_str().unwrap().to_owned();
    assert!(endpoint.ends_with("@mcp-health-redis:6379/0"), "{endpoint}");
    let redis = one(&docs, "StatefulSet", "mcp-health-redis");
    let args: Vec<&str> =
        redis["spec"]["template"]["spec"]["containers"][0]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    for (flag, value) in [("--maxmemory-policy", "noeviction"), ("--appendonly", "yes"), ("--requirepass", "$(REDIS_PASSWORD)")] {
        let i = args.iter().position(|a| *a == flag).unwrap_or_else(|| panic!("redis lacks {flag}: {args:?}"));
        assert_eq!(args[i + 1], value);
    }
    // The Redis pods are not mcp-health's: neither its Service nor its budget selects them.
    let redis_labels = &redis["spec"]["template"]["metadata"]["labels"];
    let selector = one(&docs, "Service", "mcp-health")["spec"]["selector"].as_object().unwrap().clone();
    assert!(selector.iter().any(|(k, v)| &redis_labels[k] != v), "mcp-health's selector matches the Redis pod");
}

/// The PrometheusRule's groups are the shipped alert rules (otel-config/alerts.yml, which
/// tests/ops_package.rs checks with promtool), read through the chart's symlink: one source.
#[test]
fn the_prometheus_rule_is_the_shipped_alert_rules() {
    let Some(py) = python() else { return };
    let shipped: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(root().join("otel-config/alerts.yml")).unwrap()).unwrap();
    let docs = render(&py, &["prometheusRule.enabled=true", "prometheusRule.extraLabels.release=kps"]);
    let rule = one(&docs, "PrometheusRule", "mcp-health");
    assert_eq!(rule["spec"]["groups"], shipped["groups"]);
    assert!(!shipped["groups"].as_array().unwrap().is_empty());
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    let link = std::fs::read_link(root().join(CHART).join("files/alerts.yml")).expect("files/alerts.yml is a symlink");
    assert_eq!(
        root().join(CHART).join("files").join(link).canonicalize().unwrap(),
        root().join("otel-config/alerts.yml").canonicalize().unwrap()
    );

    // With a docs base and a Grafana root, every runbook_url and dashboard_url is prefixed with
    // them, and nothing else changes.
    let (docs, grafana) = ("https://git.example.com/platform/mcp-health/blob/v0.2.0/", "https://grafana.example.com");
    let rendered = render(
        &py,
        &["prometheusRule.enabled=true", &format!("prometheusRule.runbookBaseUrl={docs}"), &format!("prometheusRule.grafanaUrl={grafana}")],
    );
    let mut want = shipped["groups"].clone();
    let mut prefixed = 0;
    for g in want.as_array_mut().unwrap() {
        for r in g["rules"].as_array_mut().unwrap() {
            let a = &mut r["annotations"];
            for (key, base) in [("runbook_url", docs), ("dashboard_url", grafana)] {
                if let Some(path) = a[key].as_str() {
                    a[key] = Value::String(format!("{base}{path}"));
                    prefixed += 1;
                }
            }
        }
    }
    assert!(prefixed >= 2, "the shipped rules carry no runbook_url/dashboard_url");
    assert_eq!(one(&rendered, "PrometheusRule", "mcp-health")["spec"]["groups"], want);
    assert!(
        render_raw(&py, &[], &["prometheusRule.enabled=true", "prometheusRule.runbookBaseUrl=https://git.example.com/no-slash"]).is_err(),
        "the values schema takes a runbookBaseUrl without its trailing /"
    );
}

/// The dashboard ConfigMap carries the shipped dashboard byte for byte, labelled for Grafana's
/// sidecar; another data source uid replaces the dashboard's own everywhere and nothing else.
#[test]
fn the_dashboard_configmap_is_the_shipped_dashboard() {
    let Some(py) = python() else { return };
    let path = root().join("otel-config/grafana/dashboards/mcp-health.json");
    let shipped = std::fs::read_to_string(&path).unwrap();
    let docs = render(&py, &["grafanaDashboard.enabled=true"]);
    let cm = one(&docs, "ConfigMap", "mcp-health-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["data"]["mcp-health.json"].as_str().unwrap(), shipped);

    let docs = render(&py, &["grafanaDashboard.enabled=true", "grafanaDashboard.datasourceUid=prom-main"]);
    let got: Value = serde_json::from_str(one(&docs, "ConfigMap", "mcp-health-dashboard")["data"]["mcp-health.json"].as_str().unwrap())
        .expect("still JSON");
    let want: Value = serde_json::from_str(&shipped.replace("\"uid\": \"mcp-health-prometheus\"", "\"uid\": \"prom-main\"")).unwrap();
    assert!(!shipped.replace("\"uid\": \"mcp-health-prometheus\"", "").contains("mcp-health-prometheus"), "a uid the replace misses");
    assert_eq!(got, want);
}

/// What the chart renders for mcp-health is a configuration the binary takes: every mode, and with
/// `--set` overrides of the collector-style keys.
#[test]
fn the_rendered_config_passes_mcp_health_validate() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    for sets in [
        &[][..],
        STATEFULSET,
        WITH_REDIS,
        &["state.enabled=true"],
        &["config.processors.memory_limiter.limit_mib=300", "config.service.telemetry.logs.encoding=json"],
    ] {
        let file = dir.path().join("mcp-health.yaml");
        std::fs::write(&file, config_text(&render(&py, sets))).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_mcp-health"))
            .arg("validate")
            .arg(&file)
            .env("MCP_HEALTH_REDIS_PASSWORD", "from-the-secret")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{sets:?}: mcp-health validate refuses the rendered config: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // And it does refuse a bad one: the check is real.
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, config_text(&render(&py, &["config.processors.mcp_health.decision_wait=soon"]))).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-health")).arg("validate").arg(&file).stdin(Stdio::null()).output().unwrap();
    assert!(!out.status.success(), "mcp-health validate took decision_wait: soon");
}

/// NOTES.txt says how to reach `/status` in each mode, and in mode statefulset how to point the
/// collector at the headless Service.
#[test]
fn notes_say_how_to_open_the_status_page() {
    let Some(py) = python() else { return };
    let notes = render_raw(&py, &["--notes"], &[]).unwrap();
    assert!(notes.contains("kubectl -n observability port-forward svc/mcp-health 13133:13133"), "{notes}");
    assert!(notes.contains("http://127.0.0.1:13133/status"), "{notes}");
    let notes = render_raw(&py, &["--notes"], STATEFULSET).unwrap();
    assert!(notes.contains("kubectl -n observability port-forward pod/mcp-health-0 13133:13133"), "{notes}");
    assert!(notes.contains("service: mcp-health.observability") && notes.contains("return_hostnames: true"), "{notes}");
}

/// docs/kubernetes.md is reachable from the README and from the multi-instance page it replaces
/// the Kubernetes snippets of, and its collector config names the Service the chart makes.
#[test]
fn the_kubernetes_page_is_linked_and_names_the_headless_service() {
    let read = |p: &str| std::fs::read_to_string(root().join(p)).unwrap();
    assert!(read("README.md").contains("docs/kubernetes.md"));
    assert!(read("docs/multi-instance.md").contains("kubernetes.md"));
    let page = read("docs/kubernetes.md");
    for want in ["service: mcp-health.observability", "ports: [14317]", "return_hostnames: true", "routing_key: traceID"] {
        assert!(page.contains(want), "docs/kubernetes.md lacks `{want}`");
    }
}

/// The image tag a chart installs by default is the release it ships with: a version bump that
/// forgets the chart fails here, not in a cluster pulling the previous image.
#[test]
fn the_chart_app_version_is_the_crate_version() {
    let chart = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/helm/mcp-health/Chart.yaml")).unwrap();
    let app = chart
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .expect("Chart.yaml has an appVersion");
    assert_eq!(app, env!("CARGO_PKG_VERSION"), "deploy/helm/mcp-health/Chart.yaml appVersion");
}
