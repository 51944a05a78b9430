use kiln_core::serving::Ensemble;
use kiln_formats::oip::{Data, DataType, Tensor};

use super::{Answer, combine};

fn tensor(name: &str, datatype: DataType, shape: &[u64], data: Data) -> Tensor {
    Tensor {
        name: name.into(),
        datatype,
        shape: shape.to_vec(),
        parameters: Default::default(),
        data,
    }
}

fn floats(values: &[f64]) -> Tensor {
    tensor(
        "p",
        DataType::Fp32,
        &[values.len() as u64],
        Data::Float(values.to_vec()),
    )
}

fn labels(values: &[i128]) -> Tensor {
    tensor(
        "label",
        DataType::Int64,
        &[values.len() as u64],
        Data::Int(values.to_vec()),
    )
}

fn names(count: usize) -> Vec<String> {
    (0..count).map(|at| format!("m{at}")).collect()
}

fn run(rule: Ensemble, answers: &[(usize, f64, Vec<Tensor>)]) -> Vec<Tensor> {
    let answers: Vec<Answer<'_>> = answers
        .iter()
        .map(|(member, weight, outputs)| Answer {
            member: *member,
            weight: *weight,
            outputs,
        })
        .collect();
    combine(rule, &answers, &names(8)).expect("combinable")
}

#[test]
fn mean_is_the_element_wise_mean_and_keeps_the_float_type() {
    let out = run(
        Ensemble::Mean,
        &[
            (0, 1.0, vec![floats(&[0.25, 0.5, 1.0])]),
            (1, 9.0, vec![floats(&[0.75, 0.0, 2.0])]),
            (2, 1.0, vec![floats(&[0.5, 1.0, 3.0])]),
        ],
    );
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].datatype, DataType::Fp32);
    assert_eq!(out[0].shape, vec![3]);
    // The weights play no part in a plain mean.
    assert_eq!(out[0].data, Data::Float(vec![0.5, 0.5, 2.0]));
}

#[test]
fn mean_of_integers_is_fp64_and_bytes_outputs_are_voted() {
    let words = |values: &[&str]| {
        tensor(
            "word",
            DataType::Bytes,
            &[values.len() as u64],
            Data::Bytes(values.iter().map(|value| value.as_bytes().to_vec()).collect()),
        )
    };
    let out = run(
        Ensemble::Mean,
        &[
            (0, 1.0, vec![labels(&[1, 2]), words(&["cat", "dog"])]),
            (1, 1.0, vec![labels(&[2, 2]), words(&["cat", "cow"])]),
        ],
    );
    assert_eq!(out[0].datatype, DataType::Fp64);
    assert_eq!(out[0].data, Data::Float(vec![1.5, 2.0]));
    assert_eq!(out[1].datatype, DataType::Bytes);
    // Element 1 ties one to one: the earliest member's value wins.
    assert_eq!(out[1].data, Data::Bytes(vec![b"cat".to_vec(), b"dog".to_vec()]));
}

#[test]
fn weighted_mean_divides_by_the_weights_of_the_members_that_answered() {
    // Member 1 (weight 2) did not answer: members 0 and 2 are weighted 1 and 3.
    let out = run(
        Ensemble::WeightedMean,
        &[(2, 3.0, vec![floats(&[1.0, 0.0])]), (0, 1.0, vec![floats(&[0.0, 1.0])])],
    );
    assert_eq!(out[0].data, Data::Float(vec![0.75, 0.25]));
}

#[test]
fn vote_takes_the_majority_and_breaks_ties_by_the_service_order() {
    // Arrival order is 2, 0, 1; the service order decides ties.
    let out = run(
        Ensemble::Vote,
        &[
            (2, 1.0, vec![labels(&[7, 3, 5, 9])]),
            (0, 1.0, vec![labels(&[7, 4, 6, 8])]),
            (1, 1.0, vec![labels(&[1, 3, 7, 9])]),
        ],
    );
    // element 0: 7 twice; 1: 3 twice; 2: a three-way tie, member 0's 6; 3: 9 twice.
    assert_eq!(out[0].data, Data::Int(vec![7, 3, 6, 9]));
    assert_eq!(out[0].datatype, DataType::Int64);
}

#[test]
fn vote_weighs_the_members() {
    let out = run(
        Ensemble::Vote,
        &[
            (0, 1.0, vec![labels(&[1, 1])]),
            (1, 1.0, vec![labels(&[1, 2])]),
            (2, 2.5, vec![labels(&[2, 2])]),
        ],
    );
    // element 0: 1 has 2.0, 2 has 2.5; element 1: 2 has 3.5.
    assert_eq!(out[0].data, Data::Int(vec![2, 2]));
}

#[test]
fn vote_on_a_tie_of_weights_goes_to_the_earliest_member() {
    let out = run(
        Ensemble::Vote,
        &[
            (1, 2.0, vec![labels(&[5])]),
            (0, 1.0, vec![labels(&[4])]),
            (2, 1.0, vec![labels(&[4])]),
        ],
    );
    assert_eq!(out[0].data, Data::Int(vec![4]));
    let out = run(
        Ensemble::Vote,
        &[(1, 1.0, vec![labels(&[5])]), (0, 1.0, vec![labels(&[4])])],
    );
    assert_eq!(out[0].data, Data::Int(vec![4]));
}

#[test]
fn first_is_the_answer_that_arrived_first() {
    let out = run(
        Ensemble::First,
        &[(1, 1.0, vec![labels(&[5])]), (0, 1.0, vec![labels(&[4])])],
    );
    assert_eq!(out[0].data, Data::Int(vec![5]));
}

#[test]
fn answers_that_disagree_on_an_output_are_refused_by_name() {
    let answers = [
        (0, 1.0, vec![floats(&[1.0, 2.0])]),
        (1, 1.0, vec![floats(&[1.0, 2.0, 3.0])]),
        (2, 1.0, vec![labels(&[1, 2])]),
    ];
    let as_answers = |picked: &[usize]| -> Vec<Answer<'_>> {
        picked
            .iter()
            .map(|&at| Answer {
                member: answers[at].0,
                weight: answers[at].1,
                outputs: &answers[at].2,
            })
            .collect()
    };
    let error = combine(Ensemble::Mean, &as_answers(&[0, 1]), &names(3)).unwrap_err();
    assert_eq!(error.0, "members m0 and m1 answered output `p` with shapes [2] and [3]");
    let error = combine(Ensemble::Mean, &as_answers(&[0, 2]), &names(3)).unwrap_err();
    assert_eq!(error.0, "member m2 did not answer output `p`, which member m0 did");
}
