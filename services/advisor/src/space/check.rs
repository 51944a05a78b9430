//! The checks of [`Space::new`](super::Space::new): each parameter's domain, then its `when`
//! conditions (known parents with finite values, no cycles).

use std::collections::BTreeMap;

use kiln_core::runs::ConfigValue;

use super::{Domain, FieldError, Param, ParamSpec, ParamType};

/// The domain `spec` describes, or `None` after pushing its problems.
pub(super) fn domain(name: &str, spec: &ParamSpec, errors: &mut Vec<FieldError>) -> Option<Domain> {
    let field = |key: &str| format!("parameters.{name}.{key}");
    let before = errors.len();
    let mut error = |key: &str, message: String| errors.push(FieldError::new(field(key), message));
    if let Some(values) = &spec.values {
        for (key, given) in [
            ("min", spec.min.is_some()),
            ("max", spec.max.is_some()),
            ("step", spec.step.is_some()),
        ] {
            if given {
                error(
                    key,
                    format!("`{key}` and `values` cannot be combined; give one or the other"),
                );
            }
        }
        if spec.log {
            error("log", "`log` applies to a min/max range, not to `values`".into());
        }
        if values.is_empty() {
            error("values", "`values` is empty; list at least one value".into());
        }
        let mut converted = Vec::with_capacity(values.len());
        for (position, value) in values.iter().enumerate() {
            let value = match (&spec.r#type, value) {
                (ParamType::Int, ConfigValue::Int(_)) => value.clone(),
                (ParamType::Int, ConfigValue::Float(v)) if v.fract() == 0.0 => ConfigValue::Int(*v as i64),
                (ParamType::Float, ConfigValue::Float(_)) => value.clone(),
                (ParamType::Float, ConfigValue::Int(v)) => ConfigValue::Float(*v as f64),
                (ParamType::Categorical, _) => value.clone(),
                (ParamType::Int | ParamType::Float, _) => {
                    error(
                        &format!("values[{position}]"),
                        format!(
                            "`{value}` is not a number of the parameter's type ({})",
                            String::from(spec.r#type.clone())
                        ),
                    );
                    continue;
                }
                (ParamType::Unknown(_), _) => continue,
            };
            if converted.iter().any(|known| super::same_value(known, &value)) {
                error(&format!("values[{position}]"), format!("`{value}` is listed twice"));
            }
            converted.push(value);
        }
        let known = unknown_type(name, spec, errors);
        return (known && errors.len() == before).then_some(Domain::Choice { values: converted });
    }
    match spec.r#type {
        ParamType::Categorical => {
            error("values", "a categorical parameter needs `values`".into());
            return None;
        }
        ParamType::Unknown(_) => {
            unknown_type(name, spec, errors);
            return None;
        }
        ParamType::Float | ParamType::Int => {}
    }
    let (Some(low), Some(high)) = (spec.min, spec.max) else {
        for (key, given) in [("min", spec.min.is_some()), ("max", spec.max.is_some())] {
            if !given {
                error(key, format!("a range needs `{key}` (or give `values` instead)"));
            }
        }
        return None;
    };
    if !low.is_finite() || !high.is_finite() {
        error("min", format!("the range [{low}, {high}] must be finite"));
        return None;
    }
    if low >= high {
        error(
            "min",
            format!("the range is empty: min ({low}) must be below max ({high})"),
        );
    }
    if spec.log && low <= 0.0 {
        error("min", format!("`log: true` needs a positive min, got {low}"));
    }
    if let Some(step) = spec.step {
        if !(step.is_finite() && step > 0.0) {
            error("step", format!("step must be a positive number, got {step}"));
        } else if step > high - low && low < high {
            error("step", format!("step {step} is wider than the range [{low}, {high}]"));
        }
        if spec.log && !(spec.r#type == ParamType::Int && step == 1.0) {
            error("step", "`step` and `log: true` cannot be combined".into());
        }
    }
    let domain = if spec.r#type == ParamType::Int {
        for (key, bound) in [("min", low), ("max", high)] {
            if bound.fract() != 0.0 {
                error(
                    key,
                    format!("an int parameter's bounds must be whole numbers, got {bound}"),
                );
            }
        }
        let step = spec.step.unwrap_or(1.0);
        if step.fract() != 0.0 {
            error(
                "step",
                format!("an int parameter's step must be a whole number, got {step}"),
            );
        }
        Domain::Int {
            low: low as i64,
            high: high as i64,
            log: spec.log,
            step: (step as i64).max(1),
        }
    } else {
        Domain::Float {
            low,
            high,
            log: spec.log,
            step: spec.step,
        }
    };
    (errors.len() == before).then_some(domain)
}

/// Pushes an error for an unknown `type`; whether the type is known.
fn unknown_type(name: &str, spec: &ParamSpec, errors: &mut Vec<FieldError>) -> bool {
    if let ParamType::Unknown(kind) = &spec.r#type {
        errors.push(FieldError::new(
            format!("parameters.{name}.type"),
            format!("unknown type `{kind}`; one of float, int, categorical"),
        ));
        return false;
    }
    true
}

/// Checks every `when` and returns an order with parents first (declaration order otherwise).
pub(super) fn conditions(params: &[Param], specs: &[(String, ParamSpec)], errors: &mut Vec<FieldError>) -> Vec<usize> {
    let index: BTreeMap<&str, usize> = params
        .iter()
        .enumerate()
        .map(|(i, param)| (param.name.as_str(), i))
        .collect();
    let mut parents: Vec<Vec<usize>> = vec![Vec::new(); params.len()];
    for (child, param) in params.iter().enumerate() {
        for (parent, wanted) in &param.when {
            let field = format!("parameters.{}.when.{parent}", param.name);
            if parent == &param.name {
                errors.push(FieldError::new(field, "a parameter cannot depend on itself"));
                continue;
            }
            let Some(&at) = index.get(parent.as_str()) else {
                // A parent that failed its own checks is reported there, not again as unknown.
                if !specs.iter().any(|(name, _)| name == parent) {
                    let known: Vec<&str> = params.iter().map(|param| param.name.as_str()).collect();
                    errors.push(FieldError::new(
                        field,
                        format!("no parameter `{parent}`; one of {}", known.join(", ")),
                    ));
                }
                continue;
            };
            let domain = &params[at].domain;
            if matches!(domain, Domain::Float { .. }) {
                errors.push(FieldError::new(
                    field,
                    format!("`{parent}` is a float range; a condition needs a parent with `values` or an int range"),
                ));
            } else if !domain.contains(wanted) {
                errors.push(FieldError::new(
                    field,
                    format!("`{wanted}` is not one of the values of `{parent}`"),
                ));
            } else {
                parents[child].push(at);
            }
        }
    }
    // Depth-first topological order; a back edge is a cycle.
    let mut state = vec![0u8; params.len()]; // 0 new, 1 on the path, 2 done
    let mut order = Vec::with_capacity(params.len());
    fn visit(
        at: usize,
        parents: &[Vec<usize>],
        state: &mut [u8],
        order: &mut Vec<usize>,
        path: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        match state[at] {
            2 => return None,
            1 => return Some(path[path.iter().position(|&p| p == at).unwrap_or(0)..].to_vec()),
            _ => {}
        }
        state[at] = 1;
        path.push(at);
        for &parent in &parents[at] {
            if let Some(cycle) = visit(parent, parents, state, order, path) {
                return Some(cycle);
            }
        }
        path.pop();
        state[at] = 2;
        order.push(at);
        None
    }
    for at in 0..params.len() {
        if let Some(cycle) = visit(at, &parents, &mut state, &mut order, &mut Vec::new()) {
            let names: Vec<&str> = cycle.iter().rev().map(|&i| params[i].name.as_str()).collect();
            errors.push(FieldError::new(
                format!("parameters.{}.when", params[cycle[0]].name),
                format!("the conditions form a cycle: {} -> {}", names.join(" -> "), names[0]),
            ));
            return (0..params.len()).collect();
        }
    }
    order
}
