//! The form body of one Query API call: `Action=...&Version=2016-11-15&Key.1=...`, in the order
//! the parameters were added (the signature covers the body as sent, so any order is valid; a
//! fixed order keeps a replayed `ClientToken` call byte-identical).

/// The API version every call names.
pub(crate) const API_VERSION: &str = "2016-11-15";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Params {
    pairs: Vec<(String, String)>,
}

impl Params {
    pub(crate) fn new(action: &str) -> Params {
        Params {
            pairs: vec![
                ("Action".to_owned(), action.to_owned()),
                ("Version".to_owned(), API_VERSION.to_owned()),
            ],
        }
    }

    pub(crate) fn action(&self) -> &str {
        &self.pairs[0].1
    }

    pub(crate) fn set(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Params {
        self.pairs.push((key.into(), value.into()));
        self
    }

    /// `prefix.1`, `prefix.2`, ... for each value (EC2 lists are 1-based).
    pub(crate) fn list<I, S>(&mut self, prefix: &str, values: I) -> &mut Params
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        for (index, value) in values.into_iter().enumerate() {
            self.pairs.push((format!("{prefix}.{}", index + 1), value.into()));
        }
        self
    }

    /// `Filter.N.Name` and `Filter.N.Value.M`, numbered after the filters already set.
    pub(crate) fn filter<I, S>(&mut self, name: &str, values: I) -> &mut Params
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let index = self
            .pairs
            .iter()
            .filter(|(key, _)| key.starts_with("Filter.") && key.ends_with(".Name"))
            .count()
            + 1;
        self.pairs.push((format!("Filter.{index}.Name"), name.to_owned()));
        self.list(&format!("Filter.{index}.Value"), values)
    }

    #[cfg(test)]
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// The `application/x-www-form-urlencoded` body, percent-encoded as SigV4 canonicalises.
    pub(crate) fn encode(&self) -> String {
        let mut body = String::new();
        for (index, (key, value)) in self.pairs.iter().enumerate() {
            if index > 0 {
                body.push('&');
            }
            percent_encode(key, &mut body);
            body.push('=');
            percent_encode(value, &mut body);
        }
        body
    }
}

/// RFC 3986 unreserved characters stay; every other byte becomes `%XX`.
fn percent_encode(text: &str, out: &mut String) {
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_lists_filters_and_reserved_characters() {
        let mut params = Params::new("DescribeInstances");
        params
            .filter("tag:kiln-cluster", ["c 1"])
            .filter("instance-state-name", ["pending", "running"])
            .set("LaunchTemplateSpecification.Version", "$Default")
            .list("InstanceId", ["i-1", "i-2"]);
        assert_eq!(
            params.encode(),
            "Action=DescribeInstances&Version=2016-11-15&Filter.1.Name=tag%3Akiln-cluster&Filter.1.Value.1=c%201\
             &Filter.2.Name=instance-state-name&Filter.2.Value.1=pending&Filter.2.Value.2=running\
             &LaunchTemplateSpecification.Version=%24Default&InstanceId.1=i-1&InstanceId.2=i-2"
        );
        assert_eq!(params.action(), "DescribeInstances");
        assert_eq!(params.get("InstanceId.2"), Some("i-2"));
    }
}
