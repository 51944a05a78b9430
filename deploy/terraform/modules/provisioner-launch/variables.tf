variable "partition" {
  description = "The AWS partition (aws, aws-cn, aws-us-gov)."
  type        = string
}

variable "region" {
  description = "The AWS region."
  type        = string
}

variable "account_id" {
  description = "The account the runners launch in."
  type        = string
}

variable "launch" {
  description = "What the provisioner launches runners from: the pools' launch templates (ARNs), the private subnets, the runner security group and the pools' images (ids), the pools' cluster placement groups (names, possibly none)."
  type = object({
    launch_template_arns  = list(string)
    subnet_ids            = list(string)
    security_group_id     = string
    image_ids             = list(string)
    placement_group_names = list(string)
  })
}
