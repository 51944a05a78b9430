//! The answers of the eight actions kiln calls, as `quick-xml` serde structs: only the fields
//! kiln reads; everything else in AWS's (long) answers is skipped. Lists are `<xSet><item>`.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::CloudError;

/// Parses an answer, naming the action when it does not fit the struct.
pub(crate) fn parse<T: DeserializeOwned>(action: &str, body: &str) -> Result<T, CloudError> {
    quick_xml::de::from_str(body).map_err(|error| {
        let head: String = body.chars().take(200).collect();
        CloudError::Unavailable(format!(
            "cannot read the answer to {action}: {error} (answer starts {head:?})"
        ))
    })
}

/// A `<xSet>` of `<item>`s; empty when absent or `<xSet/>`.
#[derive(Debug, Deserialize)]
#[serde(bound = "T: Deserialize<'de>")]
pub(crate) struct Items<T> {
    #[serde(rename = "item", default = "Vec::new")]
    pub(crate) items: Vec<T>,
}

impl<T> Default for Items<T> {
    fn default() -> Items<T> {
        Items { items: Vec::new() }
    }
}

/// `<nextToken/>` and a missing token both end a listing.
pub(crate) fn next_token(token: Option<String>) -> Option<String> {
    token.filter(|t| !t.trim().is_empty())
}

// === errors ===

/// `<Response><Errors><Error><Code>..</Code><Message>..</Message></Error></Errors>...`
#[derive(Debug, Deserialize)]
pub(crate) struct ErrorResponse {
    #[serde(rename = "Errors")]
    errors: ErrorList,
}

#[derive(Debug, Deserialize)]
struct ErrorList {
    #[serde(rename = "Error", default)]
    error: Vec<ErrorItem>,
}

#[derive(Debug, Deserialize)]
struct ErrorItem {
    #[serde(rename = "Code")]
    code: String,
    #[serde(rename = "Message", default)]
    message: String,
}

impl ErrorResponse {
    /// The first error's code and message, from an answer that is AWS's error document.
    pub(crate) fn first(body: &str) -> Option<(String, String)> {
        let response: ErrorResponse = quick_xml::de::from_str(body).ok()?;
        response.errors.error.into_iter().next().map(|e| (e.code, e.message))
    }
}

// === CreateFleet ===

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct CreateFleetResponse {
    pub(crate) fleet_id: Option<String>,
    pub(crate) error_set: Items<FleetError>,
    pub(crate) fleet_instance_set: Items<FleetInstances>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct FleetError {
    pub(crate) launch_template_and_overrides: Option<TemplateAndOverrides>,
    pub(crate) lifecycle: Option<String>,
    pub(crate) error_code: String,
    pub(crate) error_message: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct FleetInstances {
    pub(crate) launch_template_and_overrides: Option<TemplateAndOverrides>,
    pub(crate) lifecycle: Option<String>,
    pub(crate) instance_ids: Items<String>,
    pub(crate) instance_type: Option<String>,
    /// Not in AWS's model (it is under `overrides`), but the fault proxy adds it.
    pub(crate) availability_zone: Option<String>,
    pub(crate) subnet_id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct TemplateAndOverrides {
    pub(crate) overrides: Option<Overrides>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct Overrides {
    pub(crate) instance_type: Option<String>,
    pub(crate) subnet_id: Option<String>,
    pub(crate) availability_zone: Option<String>,
}

// === DescribeInstances ===

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct DescribeInstancesResponse {
    pub(crate) reservation_set: Items<Reservation>,
    pub(crate) next_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct Reservation {
    pub(crate) instances_set: Items<Instance>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct Instance {
    pub(crate) instance_id: String,
    pub(crate) instance_type: String,
    pub(crate) placement: Placement,
    pub(crate) instance_state: InstanceStateXml,
    pub(crate) launch_time: Option<String>,
    pub(crate) private_ip_address: Option<String>,
    /// `spot` for a spot instance; absent for on-demand.
    pub(crate) instance_lifecycle: Option<String>,
    pub(crate) tag_set: Items<Tag>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct Placement {
    pub(crate) availability_zone: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct InstanceStateXml {
    pub(crate) name: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Tag {
    pub(crate) key: String,
    pub(crate) value: String,
}

// === offerings ===

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct DescribeInstanceTypesResponse {
    pub(crate) instance_type_set: Items<InstanceTypeInfo>,
    pub(crate) next_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct InstanceTypeInfo {
    pub(crate) instance_type: String,
    pub(crate) v_cpu_info: VcpuInfo,
    pub(crate) memory_info: MemoryInfo,
    pub(crate) gpu_info: Option<GpuInfo>,
    pub(crate) processor_info: ProcessorInfo,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct VcpuInfo {
    pub(crate) default_v_cpus: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct MemoryInfo {
    #[serde(rename = "sizeInMiB")]
    pub(crate) size_in_mib: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct GpuInfo {
    pub(crate) gpus: Items<Gpu>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Gpu {
    pub(crate) name: String,
    pub(crate) manufacturer: String,
    pub(crate) count: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct ProcessorInfo {
    pub(crate) supported_architectures: Items<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct DescribeInstanceTypeOfferingsResponse {
    pub(crate) instance_type_offering_set: Items<TypeOffering>,
    pub(crate) next_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct TypeOffering {
    pub(crate) instance_type: String,
    pub(crate) location: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct DescribeSubnetsResponse {
    pub(crate) subnet_set: Items<Subnet>,
    pub(crate) next_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct Subnet {
    pub(crate) subnet_id: String,
    pub(crate) availability_zone: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct DescribeSpotPriceHistoryResponse {
    pub(crate) spot_price_history_set: Items<SpotPrice>,
    pub(crate) next_token: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct SpotPrice {
    pub(crate) availability_zone: String,
    pub(crate) instance_type: String,
    pub(crate) spot_price: String,
    pub(crate) timestamp: String,
}

#[cfg(feature = "test-util")]
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct CreateLaunchTemplateResponse {
    pub(crate) launch_template: LaunchTemplate,
}

#[cfg(feature = "test-util")]
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct LaunchTemplate {
    pub(crate) launch_template_id: String,
}

#[cfg(feature = "test-util")]
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct DescribeInstanceAttributeResponse {
    pub(crate) user_data: AttributeValue,
}

#[cfg(feature = "test-util")]
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(crate) struct AttributeValue {
    pub(crate) value: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_error_documents_of_aws_and_moto() {
        assert_eq!(
            ErrorResponse::first(include_str!("fixtures/aws_error_throttled.xml")),
            Some(("RequestLimitExceeded".into(), "Request limit exceeded.".into()))
        );
        let moto = r#"<?xml version="1.0" encoding="utf-8"?>
<Response xmlns="http://ec2.amazonaws.com/doc/2016-11-15"><Errors><Error><Code>InvalidInstanceID.NotFound</Code><Message>The instance IDs 'i-0123456789abcdef0, i-0123456789abcdef1' do not exist</Message></Error></Errors><RequestID>request-id</RequestID></Response>"#;
        let (code, message) = ErrorResponse::first(moto).expect("an error document");
        assert_eq!(code, "InvalidInstanceID.NotFound");
        assert!(message.contains("i-0123456789abcdef1"));
        assert_eq!(ErrorResponse::first("<html>bad gateway</html>"), None);
        assert_eq!(ErrorResponse::first(""), None);
    }

    #[test]
    fn empty_sets_and_tokens_read_as_nothing() {
        let body = r#"<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>x</requestId><reservationSet/><nextToken/></DescribeInstancesResponse>"#;
        let answer: DescribeInstancesResponse = parse("DescribeInstances", body).expect("parses");
        assert!(answer.reservation_set.items.is_empty());
        assert_eq!(next_token(answer.next_token), None);
        assert!(matches!(
            parse::<DescribeInstancesResponse>("DescribeInstances", "<<<"),
            Err(CloudError::Unavailable(_))
        ));
    }
}
