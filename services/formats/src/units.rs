//! Human units on the command line and in specs: memory sizes (`4G`), CPU cores (`0.5`) and
//! durations (`30m`).

/// Parses a memory size: `512M`, `4G`, `1.5Gi`, `1024` (bytes). Units are powers of 1024.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let shift = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('I')
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => {
            return Err(format!(
                "{text:?} is not a size: use a number with K, M, G or T, such as 512M or 4G"
            ));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size: use a number with K, M, G or T, such as 512M or 4G"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("{text:?} is not a size"));
    }
    Ok((value * (1u64 << shift) as f64).round() as u64)
}

/// Parses CPU cores (`2`, `0.5`) into thousandths of a core.
pub fn parse_cpu(text: &str) -> Result<u32, String> {
    let cores: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of cores, such as 2 or 0.5"))?;
    if !cores.is_finite() || !(0.0..=4_000_000.0).contains(&cores) {
        return Err(format!("{text:?} is not a number of cores"));
    }
    Ok((cores * 1000.0).round() as u32)
}

/// Parses a duration (`90`, `90s`, `30m`, `2h`, `1d`) into seconds.
pub fn parse_duration_secs(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let (number, unit) = trimmed.split_at(trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len()));
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!(
                "{text:?} is not a duration: use a number with s, m, h or d, such as 30m"
            ));
        }
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: use a number with s, m, h or d, such as 30m"))?;
    if value == 0 {
        return Err("a duration must be more than 0".into());
    }
    value.checked_mul(scale).ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("4Gi").unwrap(), 4 << 30);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert!(parse_size("abc").unwrap_err().contains("not a size"));
        assert!(parse_size("4X").is_err());
    }

    #[test]
    fn cpus_parse() {
        assert_eq!(parse_cpu("2").unwrap(), 2000);
        assert_eq!(parse_cpu("0.5").unwrap(), 500);
        assert_eq!(parse_cpu("0").unwrap(), 0);
        assert!(parse_cpu("two").is_err());
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration_secs("90").unwrap(), 90);
        assert_eq!(parse_duration_secs("30m").unwrap(), 1800);
        assert_eq!(parse_duration_secs("2h").unwrap(), 7200);
        assert!(parse_duration_secs("0s").is_err());
        assert!(parse_duration_secs("soon").is_err());
    }
}
