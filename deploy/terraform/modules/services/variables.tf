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
  description = "Addresses of each service's replicas from the address plan: api, scheduler, log-ingest, item-batch, advisor, predictor."
  type        = map(list(string))
}

variable "private_zone" {
  description = "The VPC's private DNS zone: the predictor advertises its REST API as http://predictor.ZONE:7078."
  type        = string
}

variable "instance_types" {
  description = "Instance type of each service: api, scheduler, log-ingest, item-batch, advisor, predictor."
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
