//! `replay --fail-on SPEC`: the conditions under which a replay is a failed CI gate.
//!
//! A CI job replays the evidence of its test run and asks one question: did anything happen that
//! this pipeline refuses? Each SPEC names one kind of finding; a replay with any finding exits 1.
//! The names are the verdicts' own (`HealthState::as_str`, `Layer::as_str`), so a spec reads like
//! the verdict lines it gates on, and a misspelt name is an error (exit 2), never a silent pass.

use std::fmt;

use crate::engine::DriftEvent;
use crate::verdict::{HealthState, Layer, Verdict};

use super::Summary;

/// One condition of `--fail-on`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum FailOn {
    /// Any verdict in one of these states.
    State(Vec<HealthState>),
    /// Any verdict whose first failed layer is one of these.
    Layer(Vec<Layer>),
    /// A success rate of the summary compared with a threshold (a fraction, 0 to 1).
    Rate { rate: Rate, cmp: Comparison, threshold: f64 },
    /// Any tool definition that differs from its pin, or any call on such a definition.
    Drift,
}

/// The two rates replay reports (SPEC section 2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Rate {
    Protocol,
    Verified,
}

impl Rate {
    /// The name in a spec; the summary's field names are accepted too.
    fn parse(s: &str) -> Option<Rate> {
        match s {
            "protocol_rate" | "protocol_success_rate" => Some(Rate::Protocol),
            "verified_rate" | "verified_success_rate" => Some(Rate::Verified),
            _ => None,
        }
    }
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Rate::Protocol => "protocol_rate",
            Rate::Verified => "verified_rate",
        }
    }
    fn of(self, s: &Summary) -> Option<f64> {
        match self {
            Rate::Protocol => s.protocol_success_rate,
            Rate::Verified => s.verified_success_rate,
        }
    }
}

/// How a rate is compared with its threshold: the rate *fails* the gate when the comparison holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Comparison {
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

impl Comparison {
    /// Two-character operators first, so `<=` is not read as `<` followed by `=0.9`.
    const ALL: [(Comparison, &'static str); 4] =
        [(Comparison::LessOrEqual, "<="), (Comparison::GreaterOrEqual, ">="), (Comparison::Less, "<"), (Comparison::Greater, ">")];
    pub(crate) fn as_str(self) -> &'static str {
        Comparison::ALL.iter().find(|(c, _)| *c == self).map_or("?", |(_, s)| s)
    }
    fn holds(self, value: f64, threshold: f64) -> bool {
        match self {
            Comparison::Less => value < threshold,
            Comparison::LessOrEqual => value <= threshold,
            Comparison::Greater => value > threshold,
            Comparison::GreaterOrEqual => value >= threshold,
        }
    }
}

impl fmt::Display for FailOn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |v: &mut dyn Iterator<Item = &'static str>| v.collect::<Vec<_>>().join(",");
        match self {
            FailOn::State(s) => write!(f, "state={}", names(&mut s.iter().map(|s| s.as_str()))),
            FailOn::Layer(l) => write!(f, "layer={}", names(&mut l.iter().map(|l| l.as_str()))),
            FailOn::Rate { rate, cmp, threshold } => write!(f, "{}{}{threshold}", rate.as_str(), cmp.as_str()),
            FailOn::Drift => f.write_str("drift"),
        }
    }
}

/// Why a `--fail-on` SPEC was refused (exit 2).
#[derive(Debug, PartialEq, thiserror::Error)]
pub(crate) enum FailOnError {
    #[error("--fail-on: empty condition")]
    Empty,
    #[error("--fail-on {0:?}: unknown health state (one of: {states})", states = HealthState::ALL.map(|s| s.as_str()).join(", "))]
    UnknownState(String),
    #[error("--fail-on {0:?}: unknown layer (one of: {layers})", layers = Layer::ALL.map(|l| l.as_str()).join(", "))]
    UnknownLayer(String),
    #[error("--fail-on {0:?}: a threshold is a number from 0 to 1 (0.9) or a percentage (90%)")]
    BadThreshold(String),
    #[error("--fail-on {0:?}: not a condition (state=NAME[,NAME…], layer=NAME[,NAME…], verified_rate<0.9, protocol_rate<0.9, drift)")]
    Unknown(String),
}

/// Parse one `--fail-on` value. Clauses are separated by commas; a bare name after `state=` or
/// `layer=` continues that list, so `state=false_success,effect_unknown,layer=authorization,drift`
/// is three conditions.
pub(crate) fn parse(spec: &str) -> Result<Vec<FailOn>, FailOnError> {
    let mut out: Vec<FailOn> = Vec::new();
    for token in spec.split(',').map(str::trim) {
        if token.is_empty() {
            return Err(FailOnError::Empty);
        }
        if token == "drift" {
            out.push(FailOn::Drift);
        } else if let Some(name) = token.strip_prefix("state=") {
            out.push(FailOn::State(vec![state(name)?]));
        } else if let Some(name) = token.strip_prefix("layer=") {
            out.push(FailOn::Layer(vec![layer(name)?]));
        } else if let Some(c) = rate(token)? {
            out.push(c);
        } else {
            // A bare name continues the list before it.
            match out.last_mut() {
                Some(FailOn::State(s)) => s.push(state(token)?),
                Some(FailOn::Layer(l)) => l.push(layer(token)?),
                _ => return Err(FailOnError::Unknown(token.into())),
            }
        }
    }
    if out.is_empty() {
        return Err(FailOnError::Empty);
    }
    Ok(out)
}

/// Parse every `--fail-on` value of the command line.
pub(crate) fn parse_all(specs: &[String]) -> Result<Vec<FailOn>, FailOnError> {
    let mut out = Vec::new();
    for s in specs {
        out.extend(parse(s)?);
    }
    Ok(out)
}

fn state(name: &str) -> Result<HealthState, FailOnError> {
    HealthState::ALL.into_iter().find(|s| s.as_str() == name).ok_or_else(|| FailOnError::UnknownState(name.into()))
}

fn layer(name: &str) -> Result<Layer, FailOnError> {
    Layer::ALL.into_iter().find(|l| l.as_str() == name).ok_or_else(|| FailOnError::UnknownLayer(name.into()))
}

/// `verified_rate<0.9`: `None` when the token is not a comparison at all.
fn rate(token: &str) -> Result<Option<FailOn>, FailOnError> {
    let Some((at, cmp, op)) = token
        .find(['<', '>'])
        .and_then(|at| Comparison::ALL.iter().find(|(_, op)| token[at..].starts_with(op)).map(|(c, op)| (at, *c, *op)))
    else {
        return Ok(None);
    };
    let name = token[..at].trim();
    let Some(rate) = Rate::parse(name) else {
        return Err(FailOnError::Unknown(token.into()));
    };
    let value = token[at + op.len()..].trim();
    let threshold = match value.strip_suffix('%') {
        Some(pct) => pct.trim().parse::<f64>().map(|p| p / 100.0),
        None => value.parse::<f64>(),
    }
    .ok()
    .filter(|t| (0.0..=1.0).contains(t))
    .ok_or_else(|| FailOnError::BadThreshold(token.into()))?;
    Ok(Some(FailOn::Rate { rate, cmp, threshold }))
}

/// What tripped the gate.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Finding {
    /// `verdicts[index]` is in a state the gate refuses, or failed first at a refused layer.
    Verdict { index: usize, condition: FailOn },
    /// `drift[index]`: a definition differs from its pin.
    Drift { index: usize },
    /// A rate compared as the condition says; `value` is `None` when there were no tool calls (a
    /// rate of nothing is not a pass: missing evidence is never green).
    Rate { condition: FailOn, value: Option<f64> },
}

/// What replay decided, as the gate reads it.
pub(crate) struct Evidence<'a> {
    pub verdicts: &'a [Verdict],
    pub drift: &'a [DriftEvent],
    pub summary: &'a Summary,
}

/// Every finding of `conditions` in `evidence`; empty when the gate passes.
pub(crate) fn evaluate(conditions: &[FailOn], evidence: &Evidence<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for c in conditions {
        match c {
            FailOn::State(states) => out.extend(
                evidence
                    .verdicts
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| states.contains(&v.state))
                    .map(|(index, _)| Finding::Verdict { index, condition: c.clone() }),
            ),
            FailOn::Layer(layers) => out.extend(
                evidence
                    .verdicts
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.first_failed_layer.is_some_and(|l| layers.contains(&l)))
                    .map(|(index, _)| Finding::Verdict { index, condition: c.clone() }),
            ),
            FailOn::Rate { rate, cmp, threshold } => {
                let value = rate.of(evidence.summary);
                if value.is_none_or(|v| cmp.holds(v, *threshold)) {
                    out.push(Finding::Rate { condition: c.clone(), value });
                }
            }
            FailOn::Drift => {
                out.extend((0..evidence.drift.len()).map(|index| Finding::Drift { index }));
                out.extend(
                    evidence
                        .verdicts
                        .iter()
                        .enumerate()
                        .filter(|(_, v)| v.state == HealthState::ContractDrift)
                        .map(|(index, _)| Finding::Verdict { index, condition: c.clone() }),
                );
            }
        }
    }
    out
}

impl Finding {
    /// One line for stderr: the condition and what matched it, in the verdict's own (redacted)
    /// names.
    pub(crate) fn describe(&self, evidence: &Evidence<'_>) -> String {
        match self {
            Finding::Verdict { index, condition } => {
                let v = &evidence.verdicts[*index];
                format!(
                    "fail-on {condition}: {} {} on {}: {} (first failed layer {}, {})",
                    v.method.as_deref().unwrap_or("-"),
                    v.tool.as_deref().unwrap_or("-"),
                    v.server.as_deref().unwrap_or("-"),
                    v.state.as_str(),
                    v.first_failed_layer.map_or("-", |l| l.as_str()),
                    v.reason.as_deref().unwrap_or("-"),
                )
            }
            Finding::Drift { index } => {
                let d = &evidence.drift[*index];
                format!("fail-on drift: {} {}: definition differs from its pin ({} change(s))", d.server, d.tool, d.changes.len().max(1))
            }
            Finding::Rate { condition, value: Some(v) } => format!("fail-on {condition}: the rate is {v:.3}"),
            Finding::Rate { condition, value: None } => format!("fail-on {condition}: no tool calls, so no rate (not a pass)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::sample;

    #[test]
    fn specs_parse_into_conditions() {
        use Comparison::*;
        use FailOn::*;
        use HealthState::*;
        let cases: &[(&str, Vec<FailOn>)] = &[
            ("state=false_success", vec![State(vec![FalseSuccess])]),
            ("state=false_success,effect_unknown", vec![State(vec![FalseSuccess, EffectUnknown])]),
            ("layer=authorization", vec![Layer(vec![crate::verdict::Layer::Authorization])]),
            ("layer=transport,protocol", vec![Layer(vec![crate::verdict::Layer::Transport, crate::verdict::Layer::Protocol])]),
            ("verified_rate<0.9", vec![FailOn::Rate { rate: super::Rate::Verified, cmp: Less, threshold: 0.9 }]),
            ("verified_rate <= 0.9", vec![FailOn::Rate { rate: super::Rate::Verified, cmp: LessOrEqual, threshold: 0.9 }]),
            ("protocol_rate>=90%", vec![FailOn::Rate { rate: super::Rate::Protocol, cmp: GreaterOrEqual, threshold: 0.9 }]),
            ("protocol_success_rate>0", vec![FailOn::Rate { rate: super::Rate::Protocol, cmp: Greater, threshold: 0.0 }]),
            ("drift", vec![Drift]),
            (
                "state=needs_auth,tool_failed,layer=outcome,drift,verified_rate<1",
                vec![
                    State(vec![NeedsAuth, ToolFailed]),
                    Layer(vec![crate::verdict::Layer::Outcome]),
                    Drift,
                    FailOn::Rate { rate: super::Rate::Verified, cmp: Less, threshold: 1.0 },
                ],
            ),
        ];
        for (spec, want) in cases {
            assert_eq!(parse(spec).as_ref(), Ok(want), "{spec}");
        }
    }

    #[test]
    fn bad_specs_are_errors_naming_what_is_wrong() {
        let cases: &[(&str, FailOnError)] = &[
            ("", FailOnError::Empty),
            ("state=false_success,", FailOnError::Empty),
            ("state=falsesuccess", FailOnError::UnknownState("falsesuccess".into())),
            ("state=false_success,green", FailOnError::UnknownState("green".into())),
            ("state=Healthy", FailOnError::UnknownState("Healthy".into())),
            ("layer=auth", FailOnError::UnknownLayer("auth".into())),
            ("verified_rate<1.5", FailOnError::BadThreshold("verified_rate<1.5".into())),
            ("verified_rate<ninety", FailOnError::BadThreshold("verified_rate<ninety".into())),
            ("verified_rate<", FailOnError::BadThreshold("verified_rate<".into())),
            ("success<0.9", FailOnError::Unknown("success<0.9".into())),
            ("verified_rate=0.9", FailOnError::Unknown("verified_rate=0.9".into())),
            ("false_success", FailOnError::Unknown("false_success".into())),
            ("drift,false_success", FailOnError::Unknown("false_success".into())),
        ];
        for (spec, want) in cases {
            assert_eq!(parse(spec).as_ref(), Err(want), "{spec}");
        }
    }

    #[test]
    fn every_state_and_layer_parses_by_its_own_name_and_displays_back() {
        for s in HealthState::ALL {
            let spec = format!("state={}", s.as_str());
            let c = parse(&spec).unwrap();
            assert_eq!(c, vec![FailOn::State(vec![s])]);
            assert_eq!(c[0].to_string(), spec);
        }
        for l in crate::verdict::Layer::ALL {
            assert_eq!(parse(&format!("layer={}", l.as_str())).unwrap(), vec![FailOn::Layer(vec![l])]);
        }
        assert_eq!(parse("verified_rate<=0.5").unwrap()[0].to_string(), "verified_rate<=0.5");
    }

    fn with(state: HealthState, layer: Option<crate::verdict::Layer>) -> Verdict {
        // The exchange completed unless a layer before the outcome failed.
        let completed = layer.is_none_or(|l| l == crate::verdict::Layer::Outcome);
        let mut v = sample("tools/call", completed, state == HealthState::Healthy);
        v.state = state;
        v.first_failed_layer = layer;
        v
    }

    #[test]
    fn conditions_find_what_they_name_and_nothing_else() {
        use crate::verdict::Layer as L;
        use HealthState::*;
        let verdicts = vec![
            with(FalseSuccess, Some(L::Outcome)),
            with(NeedsAuth, Some(L::Authorization)),
            with(Healthy, None),
            with(ContractDrift, Some(L::Protocol)),
        ];
        let summary = Summary::of(&verdicts);
        assert_eq!((summary.protocol_success_rate, summary.verified_success_rate), (Some(0.5), Some(0.25)));
        let drift = vec![];
        let ev = Evidence { verdicts: &verdicts, drift: &drift, summary: &summary };
        // (spec, indices of the verdicts found, rate findings)
        let cases: &[(&str, &[usize], usize)] = &[
            ("state=false_success,effect_unknown", &[0], 0),
            ("state=effect_unknown", &[], 0),
            ("state=healthy", &[2], 0),
            ("layer=authorization", &[1], 0),
            ("layer=execution", &[], 0),
            ("drift", &[3], 0),
            ("verified_rate<0.9", &[], 1),
            ("verified_rate<0.25", &[], 0),
            ("verified_rate<=0.25", &[], 1),
            ("verified_rate>0.2", &[], 1),
            ("verified_rate>=0.3", &[], 0),
            ("protocol_rate<0.5", &[], 0),
            ("protocol_rate<=0.5", &[], 1),
            ("state=false_success,layer=authorization", &[0, 1], 0),
        ];
        for (spec, want, rates) in cases {
            let found = evaluate(&parse(spec).unwrap(), &ev);
            let got: Vec<usize> = found
                .iter()
                .filter_map(|f| match f {
                    Finding::Verdict { index, .. } => Some(*index),
                    _ => None,
                })
                .collect();
            assert_eq!(&got, want, "{spec}");
            assert_eq!(found.iter().filter(|f| matches!(f, Finding::Rate { .. })).count(), *rates, "{spec}");
        }
    }

    #[test]
    fn a_rate_of_no_calls_fails_the_gate_and_drift_events_are_findings() {
        let none = Summary::of(&[]);
        let drift = vec![DriftEvent {
            drift: true,
            server: "s:1".into(),
            tool: "t".into(),
            pinned_digest: String::new(),
            digest: String::new(),
            changes: vec![],
            trace_id: [0; 16],
            span_id: [0; 8],
        }];
        let ev = Evidence { verdicts: &[], drift: &drift, summary: &none };
        let found = evaluate(&parse("verified_rate<0.9,protocol_rate>0.5").unwrap(), &ev);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|f| matches!(f, Finding::Rate { value: None, .. })));
        assert!(found[0].describe(&ev).contains("no tool calls"));
        assert_eq!(evaluate(&parse("drift").unwrap(), &ev), vec![Finding::Drift { index: 0 }]);
        assert!(evaluate(&parse("state=false_success").unwrap(), &ev).is_empty());
    }
}
