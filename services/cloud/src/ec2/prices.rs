//! The shipped on-demand price table, `services/cloud/prices/aws.csv` (docs/provisioner.md,
//! section 11): `region,instance_type,usd_per_hour`, sorted, its first line saying when and from
//! what it was generated. `scripts/prices/refresh.py aws` regenerates it where the internet is
//! reachable.

use std::collections::HashMap;
use std::sync::OnceLock;

const SHIPPED: &str = include_str!("../../prices/aws.csv");

#[derive(Debug, Clone, PartialEq)]
pub struct OnDemandTable {
    dated: String,
    prices: HashMap<(String, String), f64>,
}

impl OnDemandTable {
    /// The table built into this binary.
    pub fn shipped() -> &'static OnDemandTable {
        static TABLE: OnceLock<OnDemandTable> = OnceLock::new();
        TABLE
            .get_or_init(|| OnDemandTable::parse(SHIPPED).expect("the shipped price table parses (a unit test checks)"))
    }

    /// Reads the CSV: a `# generated <date> ...` line, an optional header, then one row per
    /// region and type; rows sorted by region, then type.
    pub fn parse(text: &str) -> Result<OnDemandTable, String> {
        let mut lines = text.lines();
        let first = lines.next().unwrap_or_default();
        let dated = first
            .strip_prefix("# generated ")
            .and_then(|rest| rest.split_whitespace().next())
            .ok_or_else(|| format!("the first line must be '# generated <date> ...', got {first:?}"))?
            .to_owned();
        let mut prices = HashMap::new();
        let mut previous: Option<(String, String)> = None;
        for (index, line) in lines.enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line == "region,instance_type,usd_per_hour" {
                continue;
            }
            let at = index + 2;
            let fields: Vec<&str> = line.split(',').collect();
            let [region, instance_type, price] = fields[..] else {
                return Err(format!(
                    "line {at}: expected region,instance_type,usd_per_hour, got {line:?}"
                ));
            };
            let price: f64 = price
                .parse()
                .ok()
                .filter(|p: &f64| p.is_finite() && *p > 0.0)
                .ok_or_else(|| format!("line {at}: {price:?} is not a positive price"))?;
            let key = (region.to_owned(), instance_type.to_owned());
            if previous.as_ref().is_some_and(|p| *p >= key) {
                return Err(format!(
                    "line {at}: {region},{instance_type} is out of order or repeated"
                ));
            }
            previous = Some(key.clone());
            prices.insert(key, price);
        }
        Ok(OnDemandTable { dated, prices })
    }

    /// When the table was generated, as its first line says.
    pub fn dated(&self) -> &str {
        &self.dated
    }

    pub fn price(&self, region: &str, instance_type: &str) -> Option<f64> {
        self.prices.get(&(region.to_owned(), instance_type.to_owned())).copied()
    }

    pub fn len(&self) -> usize {
        self.prices.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prices.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_table_parses_and_names_the_example_pools_types() {
        let table = OnDemandTable::parse(SHIPPED).expect("parses, sorted");
        assert!(!table.is_empty());
        assert!(table.dated().starts_with("20"), "dated {}", table.dated());
        // The example pool of docs/provisioner.md section 6, and the types the tests launch.
        for (region, instance_type) in [
            ("eu-west-1", "g5.xlarge"),
            ("eu-west-1", "g5.2xlarge"),
            ("us-east-1", "c5.large"),
            ("us-east-1", "m5.large"),
        ] {
            assert!(table.price(region, instance_type).is_some(), "{region} {instance_type}");
        }
        assert_eq!(table.price("us-east-1", "c5.large"), Some(0.085));
        assert_eq!(table.price("mars-1", "c5.large"), None);
    }

    #[test]
    fn refuses_unsorted_bad_or_undated_tables() {
        let head = "# generated 2026-01-01 from offer file x by scripts/prices/refresh.py\n";
        assert!(OnDemandTable::parse(&format!("{head}us-east-1,m5.large,0.1\nus-east-1,c5.large,0.1\n")).is_err());
        assert!(OnDemandTable::parse(&format!("{head}us-east-1,c5.large,0.1\nus-east-1,c5.large,0.1\n")).is_err());
        assert!(OnDemandTable::parse(&format!("{head}us-east-1,c5.large,free\n")).is_err());
        assert!(OnDemandTable::parse(&format!("{head}us-east-1,c5.large\n")).is_err());
        assert!(OnDemandTable::parse("us-east-1,c5.large,0.1\n").is_err());
        let table = OnDemandTable::parse(&format!(
            "{head}region,instance_type,usd_per_hour\nus-east-1,c5.large,0.1\n"
        ))
        .expect("parses");
        assert_eq!(table.dated(), "2026-01-01");
        assert_eq!(table.len(), 1);
    }
}
