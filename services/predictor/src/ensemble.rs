//! Combining the members' answers by the service's ensemble rule.
//!
//! Outputs are matched by name; every answer used must carry each output of the first one with
//! the same shape. `mean` and `weighted-mean` average numeric outputs element-wise (integer
//! outputs become FP64, float outputs keep the first member's float type) and vote BOOL and
//! BYTES outputs; `vote` takes each element's (weighted) majority, a tie going to the value of
//! the earliest member, in the service's order, among the tied ones; `first` is the answer that
//! arrived first.

use kiln_core::serving::Ensemble;
use kiln_formats::oip::{Data, DataType, Tensor};

/// One member's answer.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// The member's place in the service's order.
    pub member: usize,
    pub weight: f64,
    pub outputs: &'a [Tensor],
}

/// Answers that cannot be combined, named by output (a service whose members disagree on what
/// they return).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct Mismatch(pub String);

/// Combines `answers` (in any order; at least one) by `rule`; `names` are the members' names
/// for messages.
pub fn combine(rule: Ensemble, answers: &[Answer<'_>], names: &[String]) -> Result<Vec<Tensor>, Mismatch> {
    let mut answers = answers.to_vec();
    if rule == Ensemble::First {
        // The caller passes the answers as they arrived.
        return Ok(answers
            .first()
            .map(|answer| answer.outputs.to_vec())
            .unwrap_or_default());
    }
    answers.sort_by_key(|answer| answer.member);
    let Some(lead) = answers.first() else {
        return Ok(Vec::new());
    };
    let name_of = |member: usize| names.get(member).map(String::as_str).unwrap_or("?");
    lead.outputs
        .iter()
        .map(|output| {
            let mut each = Vec::with_capacity(answers.len());
            for answer in &answers {
                let Some(tensor) = answer.outputs.iter().find(|tensor| tensor.name == output.name) else {
                    return Err(Mismatch(format!(
                        "member {} did not answer output `{}`, which member {} did",
                        name_of(answer.member),
                        output.name,
                        name_of(lead.member)
                    )));
                };
                if tensor.shape != output.shape {
                    return Err(Mismatch(format!(
                        "members {} and {} answered output `{}` with shapes {:?} and {:?}",
                        name_of(lead.member),
                        name_of(answer.member),
                        output.name,
                        output.shape,
                        tensor.shape
                    )));
                }
                each.push((answer.weight, tensor));
            }
            let numeric = matches!(output.data, Data::Int(_) | Data::Float(_));
            match rule {
                Ensemble::Mean if numeric => mean(&each, false, output),
                Ensemble::WeightedMean if numeric => mean(&each, true, output),
                _ => vote(&each, output, &|at| name_of(answers[at].member)),
            }
        })
        .collect()
}

fn float_values(data: &Data) -> Option<Vec<f64>> {
    match data {
        // Integers of any width as f64: exact up to 2^53, which model outputs stay within.
        Data::Int(values) => Some(values.iter().map(|&value| value as f64).collect()),
        Data::Float(values) => Some(values.clone()),
        Data::Bool(_) | Data::Bytes(_) => None,
    }
}

fn mean(each: &[(f64, &Tensor)], weighted: bool, lead: &Tensor) -> Result<Tensor, Mismatch> {
    let mut sum = vec![0.0; lead.data.len()];
    let mut total = 0.0;
    for (weight, tensor) in each {
        let weight = if weighted { *weight } else { 1.0 };
        let values = float_values(&tensor.data).ok_or_else(|| {
            Mismatch(format!(
                "output `{}` is numeric from one member and {} from another",
                lead.name,
                tensor.datatype.name()
            ))
        })?;
        for (acc, value) in sum.iter_mut().zip(values) {
            *acc += weight * value;
        }
        total += weight;
    }
    for value in &mut sum {
        *value /= total;
    }
    let datatype = match lead.datatype {
        DataType::Fp16 | DataType::Fp32 | DataType::Fp64 => lead.datatype,
        _ => DataType::Fp64,
    };
    Ok(Tensor {
        name: lead.name.clone(),
        datatype,
        shape: lead.shape.clone(),
        parameters: Default::default(),
        data: Data::Float(sum),
    })
}

/// An element as a vote: equal values are one candidate.
#[derive(PartialEq)]
enum Ballot<'a> {
    Bool(bool),
    Int(i128),
    Float(u64),
    Bytes(&'a [u8]),
}

fn ballot(data: &Data, at: usize) -> Ballot<'_> {
    match data {
        Data::Bool(values) => Ballot::Bool(values[at]),
        Data::Int(values) => Ballot::Int(values[at]),
        // 0.0 and -0.0 are one value; NaNs do not reach here (a worker's JSON cannot carry one).
        Data::Float(values) => Ballot::Float((values[at] + 0.0).to_bits()),
        Data::Bytes(values) => Ballot::Bytes(&values[at]),
    }
}

fn same_kind(a: &Data, b: &Data) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

fn vote<'a>(each: &[(f64, &Tensor)], lead: &Tensor, name_of: &dyn Fn(usize) -> &'a str) -> Result<Tensor, Mismatch> {
    if let Some(at) = each.iter().position(|(_, tensor)| !same_kind(&tensor.data, &lead.data)) {
        return Err(Mismatch(format!(
            "output `{}` is {} from member {} and {} from member {}",
            lead.name,
            lead.datatype.name(),
            name_of(0),
            each[at].1.datatype.name(),
            name_of(at)
        )));
    }
    // For each element, the answer (by its place in `each`, which is the service's order) whose
    // value wins.
    let winners: Vec<usize> = (0..lead.data.len())
        .map(|element| {
            // (the first answer holding the value, its weight so far)
            let mut tally: Vec<(usize, f64)> = Vec::with_capacity(each.len());
            for (at, (weight, tensor)) in each.iter().enumerate() {
                let value = ballot(&tensor.data, element);
                match tally
                    .iter_mut()
                    .find(|(first, _)| ballot(&each[*first].1.data, element) == value)
                {
                    Some((_, sum)) => *sum += weight,
                    None => tally.push((at, *weight)),
                }
            }
            // The tally is in order of first appearance, so the strict `>` keeps the earliest of
            // tied candidates.
            let mut best = tally[0];
            for &candidate in &tally[1..] {
                if candidate.1 > best.1 {
                    best = candidate;
                }
            }
            best.0
        })
        .collect();
    let pick = |element: usize| &each[winners[element]].1.data;
    let data = match &lead.data {
        Data::Bool(_) => Data::Bool(
            (0..winners.len())
                .map(|e| matches!(pick(e), Data::Bool(v) if v[e]))
                .collect(),
        ),
        Data::Int(_) => Data::Int(
            (0..winners.len())
                .map(|e| match pick(e) {
                    Data::Int(v) => v[e],
                    _ => unreachable!("kinds were checked"),
                })
                .collect(),
        ),
        Data::Float(_) => Data::Float(
            (0..winners.len())
                .map(|e| match pick(e) {
                    Data::Float(v) => v[e],
                    _ => unreachable!("kinds were checked"),
                })
                .collect(),
        ),
        Data::Bytes(_) => Data::Bytes(
            (0..winners.len())
                .map(|e| match pick(e) {
                    Data::Bytes(v) => v[e].clone(),
                    _ => unreachable!("kinds were checked"),
                })
                .collect(),
        ),
    };
    Ok(Tensor {
        name: lead.name.clone(),
        datatype: lead.datatype,
        shape: lead.shape.clone(),
        parameters: Default::default(),
        data,
    })
}

#[cfg(test)]
mod tests;
