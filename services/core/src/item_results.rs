//! The outcomes of batch items as they travel on `KILN_ITEM_RESULTS`: grouped, one message per
//! group a worker's session recorded together ([`pb::ItemResults`]), read by item-batch (into the
//! items' rows) and log-ingest (the items' lines). A message holding a bare [`pb::ItemResult`],
//! as published before outcomes were grouped, is read as a group of one.

use bytes::Bytes;
use kiln_proto::v1 as pb;
use prost::Message;

/// The message of a group of outcomes.
pub fn encode(results: Vec<pb::ItemResult>) -> Bytes {
    pb::ItemResults { results }.encode_to_vec().into()
}

/// The outcomes a message holds.
pub fn decode(payload: &[u8]) -> Result<Vec<pb::ItemResult>, prost::DecodeError> {
    let group = pb::ItemResults::decode(payload)?;
    if !group.results.is_empty() {
        return Ok(group.results);
    }
    // A bare ItemResult's fields are all unknown to ItemResults.
    let result = pb::ItemResult::decode(payload)?;
    Ok(if result == pb::ItemResult::default() {
        Vec::new()
    } else {
        vec![result]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(key: &str, attempt: u32) -> pb::ItemResult {
        pb::ItemResult {
            batch_id: "b".into(),
            key: key.into(),
            attempt,
            state: pb::ItemState::Succeeded as i32,
            exit_code: Some(0),
            lines: vec![pb::LogEntry {
                text: format!("line of {key}"),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_group_reads_back_in_order() {
        let results = vec![result("a", 1), result("b", 2), result("c", 1)];
        assert_eq!(decode(&encode(results.clone())).unwrap(), results);
    }

    #[test]
    fn a_bare_result_of_before_the_groups_reads_as_a_group_of_one() {
        let bare = result("a", 3);
        assert_eq!(decode(&bare.encode_to_vec()).unwrap(), vec![bare]);
    }

    #[test]
    fn an_empty_message_holds_no_outcome_and_garbage_is_an_error() {
        assert_eq!(decode(&[]).unwrap(), Vec::new());
        assert!(decode(&[0xff, 0xff, 0xff]).is_err());
    }
}
