//! Which instance types a pool's [`Requirements`] admit; the ec2 and sim clouds filter their
//! catalogues with it.

use crate::{Requirements, Shape};

impl Requirements {
    /// Whether an instance type of this shape is inside every range (the bounds inclusive), of
    /// one of the families and GPU models named (when any are).
    pub fn admits(&self, instance_type: &str, shape: &Shape) -> bool {
        let gib = 1024.0 * 1024.0 * 1024.0;
        let within = |range: Option<[u32; 2]>, value: i64| {
            range.is_none_or(|[low, high]| (i64::from(low)..=i64::from(high)).contains(&value))
        };
        let family = instance_type.split('.').next().unwrap_or(instance_type);
        within(self.vcpu, shape.cpu_millis / 1000)
            && within(self.gpus, shape.gpus)
            && self.memory_gib.is_none_or(|[low, high]| {
                let memory = shape.memory_bytes as f64 / gib;
                memory >= low - 1e-9 && memory <= high + 1e-9
            })
            && (self.families.is_empty() || self.families.iter().any(|f| f.eq_ignore_ascii_case(family)))
            && (self.gpu_model.is_empty()
                || shape
                    .gpu_model
                    .as_deref()
                    .is_some_and(|model| self.gpu_model.iter().any(|m| m.eq_ignore_ascii_case(model))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_admit_shapes_inside_every_range() {
        let gib = 1i64 << 30;
        let g5 = Shape {
            cpu_millis: 4000,
            memory_bytes: 16 * gib,
            gpus: 1,
            gpu_model: Some("A10G".into()),
            arch: "x86_64".into(),
        };
        let wanted = Requirements {
            vcpu: Some([4, 16]),
            memory_gib: Some([16.0, 64.0]),
            gpus: Some([1, 1]),
            gpu_model: vec!["a10g".into()],
            families: vec!["g5".into(), "g6".into()],
        };
        assert!(wanted.admits("g5.xlarge", &g5));
        assert!(!wanted.admits("g4dn.xlarge", &g5), "family");
        let small = Shape {
            cpu_millis: 2000,
            ..g5.clone()
        };
        assert!(!wanted.admits("g5.large", &small), "vcpu");
        let t4 = Shape {
            gpu_model: Some("T4".into()),
            ..g5.clone()
        };
        assert!(!wanted.admits("g5.xlarge", &t4), "gpu model");
        assert!(Requirements::default().admits("anything.large", &Shape::default()));
    }
}
