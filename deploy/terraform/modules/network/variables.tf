variable "name" {
  description = "Prefix of every resource's Name tag."
  type        = string
}

variable "cidr" {
  description = "The VPC's IPv4 range; each AZ gets a /20 public and a /20 private subnet of it."
  type        = string
}

variable "azs" {
  description = "Availability zones to spread the subnets over, by name (2 or 3)."
  type        = list(string)
}

variable "single_nat_gateway" {
  description = "One NAT gateway for every AZ (cheaper) instead of one per AZ (survives an AZ loss)."
  type        = bool
}

variable "kms_key_arn" {
  description = "The key the flow logs' log group is encrypted with."
  type        = string
}

variable "flow_log_retention_days" {
  description = "How long the VPC flow logs are kept."
  type        = number
}
