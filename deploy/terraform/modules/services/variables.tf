variable "name" {
  description = "Name prefix."
  type        = string
}

variable "region" {
  description = "The AWS region (for the S3 client and the CLI at boot)."
  type        = string
}

variable "subnet_ids" {
  description = "Private subnets, one per AZ."
  type        = list(string)
}

variable "private_ips" {
  description = "Addresses of each service's replicas from the address plan: api, scheduler, log-ingest, item-batch, advisor, predictor, provisioner."
  type        = map(list(string))
}

variable "private_zone" {
  description = "The VPC's private DNS zone: the predictor advertises its REST API as http://predictor.ZONE:7078."
  type        = string
}

variable "instance_types" {
  description = "Instance type of each service: api, scheduler, log-ingest, item-batch, advisor, predictor, provisioner."
  type        = map(string)
}

variable "ami_id" {
  description = "An Amazon Linux 2023 image."
  type        = string
}

variable "security_group_ids" {
  description = "The security groups module's ids by kind."
  type        = map(string)
}

variable "kms_key_arn" {
  description = "The kiln key (volumes, S3 objects, the database secret)."
  type        = string
}

variable "bucket" {
  description = "The kiln bucket's name."
  type        = string
}

variable "bucket_arn" {
  description = "The kiln bucket's ARN."
  type        = string
}

variable "objects_prefix" {
  description = "The prefix of kiln's blobs in the bucket (no slashes at either end)."
  type        = string
}

variable "release_prefix" {
  description = "The prefix of the kiln release's binaries in the bucket (releases/VERSION)."
  type        = string
}

variable "nats_urls" {
  description = "NATS client URLs, comma-separated."
  type        = string
}

variable "nats_seed_prefix" {
  description = "The SSM Parameter Store path under which each service's NATS NKey seed is (<prefix>/<service>, SecureString)."
  type        = string
}

variable "nats_seed_arn_prefix" {
  description = "The ARN of that path (arn:aws:ssm:REGION:ACCOUNT:parameter<prefix>), for the instance roles."
  type        = string
}

variable "nats_replicas" {
  description = "Replicas of kiln's streams and buckets."
  type        = number
}

variable "database" {
  description = "Where Postgres is, and the secret that holds its master password."
  type = object({
    host       = string
    port       = number
    name       = string
    secret_arn = string
  })
}

variable "scylla_nodes" {
  description = "Scylla contact points, host:port."
  type        = list(string)
}

variable "scylla_keyspace" {
  description = "log-ingest's keyspace."
  type        = string
}

variable "scylla_replication_factor" {
  description = "Replication factor of log-ingest's keyspace."
  type        = number
}

variable "scylla_password_parameter" {
  description = "SSM SecureString holding the Scylla password of log-ingest's role `kiln`."
  type        = string
}

variable "scylla_password_parameter_arn" {
  description = "The ARN of that parameter, for log-ingest's role."
  type        = string
}

variable "cluster" {
  description = "The kiln cluster id: provisioner.toml's `cluster`, and the kiln-cluster tag the provisioner's role may launch and terminate under."
  type        = string
}

variable "provisioner_pools" {
  description = "The runner pools of provisioner.toml ([[pools]], docs/provisioner.md section 6): where and what the provisioner may launch for each."
  type = list(object({
    name           = string
    region         = string
    subnets        = list(string)
    instance_types = list(string)
    requirements = object({
      vcpu       = list(number)
      memory_gib = list(number)
      gpus       = list(number)
      gpu_model  = list(string)
      families   = list(string)
    })
    capacity_types    = list(string)
    launch_template   = string
    max_instances     = number
    idle_timeout_secs = number
    boot_timeout_secs = number
    labels            = map(string)
    on_demand_prices  = map(number)
    # The cluster placement group the pool's gangs launch into (`placement-group`), or null.
    placement_group = string
    # The root volume the provisioner sizes for the jobs' --disk (`disk`): the most the jobs
    # of one machine may ask for, the template's own size, its root device.
    disk = object({
      max_job_gib = number
      root_gib    = number
      root_device = string
    })
  }))
}

variable "provisioner_launch" {
  description = "What the provisioner's role may launch runners from (the pools' launch templates, the private subnets, the runner security group, the pools' images, the pools' cluster placement groups by name, possibly none) and the runner roles it may pass to EC2."
  type = object({
    launch_template_arns  = list(string)
    subnet_ids            = list(string)
    security_group_id     = string
    image_ids             = list(string)
    runner_role_arns      = list(string)
    placement_group_names = list(string)
  })
}
